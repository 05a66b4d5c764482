"""A softmax's masked logits: captured in a model run, carried by its row, masked again by the replay.

An element far below its row's maximum takes the device's slower exponential: on an H200, GPT-OSS's
prefill softmax ([1, 64, 512, 513] bf16) took 40.5 us on random logits, 52.3 under its causal mask
and 62.5 with as many masked elements at random places (``reproduce/wip/softmax_masked_values.py``).
Here an eager causal attention runs on the CPU under ``torch.profiler`` and the capture, the real
trace is ingested and its row replayed; an Ascend profile's ``SoftmaxV2`` kernel is linked to its
captured call through trace_view.json as the other captured kernels are.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.capture import capture_input_values
from perf_plugin.capture.masked_rows import BUDGET, UNDERFLOW, masked_rows, row_blocks
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.masked_shares_cell import masked_shares_cell, parse_masked_shares_cell
from perf_plugin.database.schema import PROFILING_INPUT_MASKED_SHARES
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.trace.values_file import CapturedCall, CapturedValues, read_values_file, write_values_file
from tests.kernels.support import kernel_row, replay_of, replay_on_cpu
from tests.test_ascend_input_values import linked_row

HEADS, TOKENS, HEAD_DIM = 4, 64, 16


def causal_scores(heads: int, tokens: int, seed: int = 0) -> torch.Tensor:
    """An eager attention's masked logits, as ``transformers`` makes them: ``q k^T`` scaled, plus
    a mask holding the dtype's lowest value above the diagonal."""
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, heads, tokens, HEAD_DIM, generator=generator) for _ in range(2))
    future = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
    mask = torch.zeros(tokens, tokens).masked_fill(future, torch.finfo(torch.float32).min)
    return q @ k.transpose(-1, -2) * HEAD_DIM ** -0.5 + mask


def profile_attention(directory: Path, scores: torch.Tensor) -> Path:
    trace = directory / "trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with capture_input_values(directory / "trace.values.json"):
            torch.nn.functional.softmax(scores, dim=-1)
            torch.softmax(torch.randn(TOKENS, 16), dim=-1)  # a router's scores: nothing masked
    prof.export_chrome_trace(str(trace))
    return trace


CAUSAL_SHARE = (TOKENS - 1) / 2 / TOKENS  # below the diagonal of a square: (n - 1) / 2n
CAUSAL_RUNS = (TOKENS - 1) / TOKENS  # one run a row, but the last row's none


# ----------------------------------------------------------------------------- what is masked
def test_masked_elements_are_those_whose_exponential_underflows_against_the_rows_maximum() -> None:
    lowest = torch.finfo(torch.bfloat16).min
    rows = [[0.0, -math.inf, lowest, -90.0, -60.0, 1.0], [lowest] * 3, [-math.inf] * 2]
    assert UNDERFLOW == pytest.approx(-87.34, abs=0.01)
    # -inf, the lowest value and 91 below the maximum are masked (one run); 61 below is not; a
    # row all at the lowest value has its maximum there, and a row all -inf no maximum
    summary = masked_rows(rows[:3])
    assert summary.share == pytest.approx(3 / 11) and summary.runs == pytest.approx(1 / 3)
    assert masked_rows([[0.0, -math.inf, 0.0, -math.inf, -math.inf]]).runs == 2
    assert masked_rows([]).share == 0.0


def test_a_large_input_is_read_in_evenly_spaced_blocks_of_whole_rows() -> None:
    assert row_blocks(10, 4) == [(0, 10)]  # it fits: all of it
    blocks = row_blocks(32768, 513)
    assert len(blocks) == 32 and blocks[0][0] == 0 and blocks[-1][1] == 32768
    assert sum(stop - start for start, stop in blocks) * 513 <= BUDGET
    starts = [start for start, _ in blocks]
    assert starts == sorted(set(starts)) and max(b - a for a, b in zip(starts, starts[1:])) <= 32768 // 31 + 1
    assert row_blocks(3, 100_000) == [(1, 2)]  # a row wider than the budget: the middle one
    assert row_blocks(0, 8) == []


# ----------------------------------------------------------------------------- the cell and the file
def test_a_rows_cell_is_the_mean_share_and_runs_per_slot_over_its_calls() -> None:
    assert masked_shares_cell([{0: (0.5, 1.0)}, {0: (0.25, 3.0)}]) == "0.375:2"
    assert masked_shares_cell([{1: (0.5, 1.0)}, {}]) == ";0.5:1"
    assert masked_shares_cell([{0: (0.0, 0.0)}, {}]) == ""  # recorded, nothing masked: no cell
    assert parse_masked_shares_cell("0.375:2;;0:0") == ((0.375, 2.0), None, (0.0, 0.0))
    assert parse_masked_shares_cell(" ") == ()


@pytest.mark.parametrize("cell", ["0.5", "1.5:1", "0.5:-1", "x:1", "0.5:nan"])
def test_a_cell_that_is_not_share_and_runs_names_its_slot(cell: str) -> None:
    with pytest.raises(DatabaseError, match="slot 0: .* is not SHARE:RUNS"):
        parse_masked_shares_cell(cell)


def test_masked_records_survive_the_values_file_and_bad_ones_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.values.json"
    write_values_file(path, CapturedValues("t", {"0": CapturedCall("torch.softmax", {}, masked={0: (0.5, 1.0)})}))
    assert read_values_file(path).calls["0"].masked == {0: (0.5, 1.0)}
    document = json.loads(path.read_text())
    for bad in ([1.5, 1.0], [0.5], [0.5, -2]):
        document["calls"]["0"]["masked"]["0"] = bad
        path.write_text(json.dumps(document))
        with pytest.raises(DatabaseError, match="call '0'"):
            read_values_file(path)


# ----------------------------------------------------------------------------- capture and ingest
def test_the_capture_records_a_causal_masks_share_and_runs(tmp_path: Path) -> None:
    profile_attention(tmp_path, causal_scores(HEADS, TOKENS))
    calls = {call.function: call.masked for call in read_values_file(tmp_path / "trace.values.json").calls.values()}
    ((share, runs),) = calls["torch.nn.functional.softmax"].values()
    assert share == pytest.approx(CAUSAL_SHARE) and runs == pytest.approx(CAUSAL_RUNS)
    assert calls["torch.softmax"] == {0: (0.0, 0.0)}


def test_a_large_input_is_sampled_close_to_its_true_share(tmp_path: Path) -> None:
    scores = causal_scores(8, 512)  # 2 M elements, 32 blocks of 3 rows read
    with capture_input_values(tmp_path / "run.values.json") as capture:
        scores.softmax(-1)
        scores.transpose(-1, -2).softmax(-2)  # rows that are not the last dimension's: not read
    ((share, runs),) = capture.values.calls["0"].masked.values()
    assert share == pytest.approx(511 / 1024, abs=0.02) and runs == pytest.approx(1.0, abs=0.02)
    assert capture.values.calls["1"].masked == {}


def test_ingest_writes_the_share_and_runs_on_the_softmax_row(tmp_path: Path) -> None:
    ingest_path(profile_attention(tmp_path, causal_scores(HEADS, TOKENS, seed=1)), tmp_path / "db")
    with (tmp_path / "db" / "SoftmaxV2.csv").open(newline="") as handle:
        rows = {row["Input Shapes"]: row for row in csv.DictReader(handle)}
    (attention,) = parse_masked_shares_cell(rows[f'"1,{HEADS},{TOKENS},{TOKENS}"'][PROFILING_INPUT_MASKED_SHARES])
    assert attention == pytest.approx((CAUSAL_SHARE, CAUSAL_RUNS), rel=1e-5)  # six digits written
    assert rows[f'"{TOKENS},16"'].get(PROFILING_INPUT_MASKED_SHARES, "") == ""


# ----------------------------------------------------------------------------- the replay
def _softmax_cells(masked: str, dtype: str = "DT_BF16") -> dict[str, str]:
    shape = f'"{TOKENS},{TOKENS}"'
    return {"Input Shapes": shape, "Input Data Types": dtype, "Input Formats": "ND", "Output Shapes": shape,
            "Output Data Types": dtype, "Output Formats": "ND", PROFILING_INPUT_MASKED_SHARES: masked}


def _runs_per_row(masked: torch.Tensor) -> list[int]:
    starts = masked & ~torch.nn.functional.pad(masked, (1, 0))[:, :-1]
    return starts.sum(dim=-1).tolist()


@pytest.mark.parametrize("runs", [1, 3, 8])
def test_the_replay_masks_each_row_in_the_recorded_runs_and_verifies(runs: int) -> None:
    cells = _softmax_cells(f"0.5:{runs}")
    x, dim, _ = replay_of("SoftmaxV2").make_inputs(kernel_row("SoftmaxV2", cells), torch.device("cpu"),
                                                   torch.Generator().manual_seed(0))
    masked = x == torch.finfo(torch.bfloat16).min
    assert dim == -1 and masked.sum(dim=-1).tolist() == [TOKENS // 2] * TOKENS
    assert _runs_per_row(masked) == [runs] * TOKENS
    assert len({tuple(row) for row in masked.tolist()}) > 10  # at random places, row by row
    outputs, _ = replay_on_cpu("SoftmaxV2", cells)
    assert int((outputs[masked] == 0).sum()) == int(masked.sum())


def test_a_row_masked_whole_stays_finite_and_a_row_without_the_cell_masks_nothing() -> None:
    outputs, _ = replay_on_cpu("SoftmaxV2", _softmax_cells("1:1", "FLOAT"))
    assert torch.allclose(outputs, torch.full_like(outputs, 1 / TOKENS))
    x, _, _ = replay_of("SoftmaxV2").make_inputs(kernel_row("SoftmaxV2", _softmax_cells("")), torch.device("cpu"),
                                                 torch.Generator().manual_seed(0))
    assert bool(torch.isfinite(x).all()) and float(x.min()) > -100


def test_a_bad_cell_fails_the_case_naming_the_column() -> None:
    with pytest.raises(CaseBuildError, match=f"'{PROFILING_INPUT_MASKED_SHARES}' slot 0"):
        replay_of("SoftmaxV2").make_inputs(kernel_row("SoftmaxV2", _softmax_cells("2:1")), torch.device("cpu"),
                                           torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- an Ascend profile
# Named as the real Level1 profile names its LogSoftmaxV2 kernels (aclnnLogSoftmax_LogSoftmaxAiCore_LogSoftmaxV2).
SOFTMAX_KERNEL = "aclnnSoftmax_SoftmaxV2AiCore_SoftmaxV2"


def test_an_ascend_softmax_row_gets_its_calls_masked_share_and_the_replay_masks_it(tmp_path: Path) -> None:
    """A causal attention's softmax captured, its ``SoftmaxV2`` kernel linked through trace_view.json."""
    with capture_input_values(tmp_path / "prof" / "rank0.values.json") as capture:
        torch.softmax(causal_scores(1, TOKENS)[0, 0], dim=-1)
    ((share, runs),) = capture.values.calls["0"].masked.values()
    shape = f'"{TOKENS},{TOKENS}"'
    cells = {"Type": "SoftmaxV2", "Input Shapes": shape, "Input Data Types": "FLOAT", "Input Formats": "FORMAT_ND",
             "Output Shapes": shape, "Output Data Types": "FLOAT", "Output Formats": "FORMAT_ND"}
    row = linked_row(tmp_path, capture.values.token, cells, SOFTMAX_KERNEL, "aten::softmax")
    assert parse_masked_shares_cell(row[PROFILING_INPUT_MASKED_SHARES]) == (pytest.approx((share, runs), rel=1e-5),)
    x, _, _ = replay_of("SoftmaxV2").make_inputs(kernel_row("SoftmaxV2", row), torch.device("cpu"),
                                                 torch.Generator().manual_seed(0))
    assert int((x == torch.finfo(torch.float32).min).sum()) == TOKENS * round(share * TOKENS)
