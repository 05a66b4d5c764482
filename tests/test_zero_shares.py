"""A division's zero operands: captured in a model run, carried by its row, zeroed by the replay.

A device divides a zero numerator on a slower path: PhiMoE's router divides ``max - scores`` (zero
at each row's maximum) by ``|scores|`` clamped at the max, which an H200 ran in 2.05 us on the
router's own operands and in 1.12 on random ones (``reproduce/wip/division_operand_values.py``).
Here the router's operations run on the CPU under ``torch.profiler`` and the capture, and the
real trace is ingested and its row replayed.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.capture import capture_input_values
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import PROFILING_INPUT_ZERO_SHARES
from perf_plugin.database.shares_cell import parse_shares_cell as parse_zero_shares_cell
from perf_plugin.database.shares_cell import shares_cell as zero_shares_cell
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.trace.values_file import CapturedCall, CapturedValues, read_values_file, write_values_file
from tests.kernels.support import kernel_row, replay_of, replay_on_cpu

TOKENS, EXPERTS = 64, 16


def sparse_mixer_threshold(scores: torch.Tensor) -> torch.Tensor:
    """The first half of PhiMoE's ``sparsemixer`` (transformers' ``modeling_phimoe``): which
    experts lie within the jitter of the best one, by the distance to the maximum over the scale."""
    top, _ = scores.max(dim=-1, keepdim=True)
    factor = scores.abs().clamp(min=top)
    return ((top - scores) / factor) > 0.02


def profile_router(directory: Path, scores: torch.Tensor) -> Path:
    trace = directory / "trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with capture_input_values(directory / "trace.values.json"):
            sparse_mixer_threshold(scores)
            torch.div(scores, 2.0)  # by a number: only the tensor is recorded, and it holds no zero
    prof.export_chrome_trace(str(trace))
    return trace


def router_scores(seed: int) -> torch.Tensor:
    return torch.randn(TOKENS, EXPERTS, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- the cell
def test_a_rows_cell_is_the_mean_share_per_slot_over_its_calls() -> None:
    assert zero_shares_cell([{0: 0.0625, 1: 0.0}, {0: 0.125, 1: 0.0}]) == "0.09375;0"
    assert zero_shares_cell([{1: 0.5}, {}]) == ";0.5"  # slot 0 recorded by no call
    assert zero_shares_cell([{0: 0.0, 1: 0.0}, {}]) == ""  # no zero anywhere: no cell
    assert parse_zero_shares_cell("0.09375;;0") == (0.09375, None, 0.0)
    assert parse_zero_shares_cell("") == ()


@pytest.mark.parametrize("cell", ["1.5", "x;0", "0;-0.1", "0;nan"])
def test_a_cell_that_is_not_shares_names_its_slot(cell: str) -> None:
    with pytest.raises(DatabaseError, match="slot [01]: .* is not a share between 0 and 1"):
        parse_zero_shares_cell(cell)


def test_zero_shares_survive_the_values_file_and_bad_ones_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.values.json"
    write_values_file(path, CapturedValues("t", {"0": CapturedCall("torch.Tensor.div", {}, zeros={0: 0.25, 1: 0.0})}))
    assert read_values_file(path).calls["0"].zeros == {0: 0.25, 1: 0.0}
    document = json.loads(path.read_text())
    document["calls"]["0"]["zeros"]["0"] = 2
    path.write_text(json.dumps(document))
    with pytest.raises(DatabaseError, match="call '0': zero shares must be numbers between 0 and 1"):
        read_values_file(path)


# ----------------------------------------------------------------------------- capture and ingest
def test_the_capture_records_the_share_of_zero_elements_of_each_divisions_operands(tmp_path: Path) -> None:
    scores = router_scores(0)
    profile_router(tmp_path, scores)
    calls = [call for call in read_values_file(tmp_path / "trace.values.json").calls.values() if call.zeros]
    top = scores.max(dim=-1, keepdim=True).values
    expected = float(((top - scores) == 0).sum()) / scores.numel()
    assert expected == 1 / EXPERTS  # one zero a row: each row's maximum
    assert [call.zeros for call in calls] == [{0: expected, 1: 0.0}, {0: 0.0}]


def test_ingest_writes_the_share_on_the_division_row(tmp_path: Path) -> None:
    ingest_path(profile_router(tmp_path, router_scores(1)), tmp_path / "db")
    with (tmp_path / "db" / "RealDiv.csv").open(newline="") as handle:
        rows = {row["Input Shapes"]: row for row in csv.DictReader(handle)}
    router = rows[f'"{TOKENS},{EXPERTS};{TOKENS},{EXPERTS}"']
    assert parse_zero_shares_cell(router[PROFILING_INPUT_ZERO_SHARES]) == (1 / EXPERTS, 0.0)
    halved = rows[f'"{TOKENS},{EXPERTS};"']
    assert halved.get(PROFILING_INPUT_ZERO_SHARES, "") == ""  # recorded, but no zero: no cell


# ----------------------------------------------------------------------------- the replay
def _division_cells(shares: str) -> dict[str, str]:
    return {"Input Shapes": f'"{TOKENS},{EXPERTS};{TOKENS},{EXPERTS}"', "Input Data Types": "DT_BF16;DT_BF16",
            "Input Formats": "ND;ND", "Output Shapes": f'"{TOKENS},{EXPERTS}"', "Output Data Types": "DT_BF16",
            "Output Formats": "ND", PROFILING_INPUT_ZERO_SHARES: shares}


def test_the_replay_zeroes_the_recorded_share_of_each_operand() -> None:
    replay = replay_of("RealDiv")
    generator = torch.Generator().manual_seed(0)
    numerator, denominator = replay.make_inputs(kernel_row("RealDiv", _division_cells("0.0625;0")),
                                                torch.device("cpu"), generator)
    assert int((numerator == 0).sum()) == TOKENS  # 0.0625 of 64 x 16
    assert int((denominator == 0).sum()) == 0
    rows_with_a_zero = int(((numerator == 0).sum(dim=-1) > 0).sum())
    assert 1 < rows_with_a_zero <= TOKENS  # placed at random, not in one row
    outputs, _ = replay_on_cpu("RealDiv", _division_cells("0.0625;0"))
    assert int((outputs == 0).sum()) == TOKENS


def test_a_row_without_the_cell_draws_no_zero() -> None:
    cells = _division_cells("")
    x, y = replay_of("RealDiv").make_inputs(kernel_row("RealDiv", cells), torch.device("cpu"),
                                            torch.Generator().manual_seed(0))
    assert int((x == 0).sum()) == int((y == 0).sum()) == 0


def test_a_bad_cell_fails_the_case_naming_the_column() -> None:
    with pytest.raises(CaseBuildError, match=f"'{PROFILING_INPUT_ZERO_SHARES}' slot 0"):
        replay_of("RealDiv").make_inputs(kernel_row("RealDiv", _division_cells("2")), torch.device("cpu"),
                                         torch.Generator().manual_seed(0))


def test_a_denominators_zeros_avoid_the_numerators_so_no_nan_is_made() -> None:
    """Both operands with zeros: the division gives infinities where the model divided by zero,
    never a 0/0 the model did not make, and the replay verifies."""
    cells = _division_cells("0.25;0.25")
    x, y = replay_of("RealDiv").make_inputs(kernel_row("RealDiv", cells), torch.device("cpu"),
                                            torch.Generator().manual_seed(0))
    assert int((x == 0).sum()) == int((y == 0).sum()) == TOKENS * EXPERTS // 4
    assert int(((x == 0) & (y == 0)).sum()) == 0
    outputs, _ = replay_on_cpu("RealDiv", cells)
    assert int(torch.isinf(outputs).sum()) == TOKENS * EXPERTS // 4 and not bool(torch.isnan(outputs).any())


# ----------------------------------------------------------------------------- a batched GEMM's zero rows
LLAMA4_EXPERTS, HIDDEN, WIDTH = 4, 64, 32


def llama4_expert_inputs(tokens: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's experts' input (transformers' ``Llama4TextMoe``): every token repeated for every
    expert, scaled by its router score, which is zero but for its top-1 expert; and the weights."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=generator)
    logits = torch.randn(tokens, LLAMA4_EXPERTS, generator=generator)
    top = logits.topk(1, dim=-1)
    scores = torch.full_like(logits, float("-inf")).scatter_(1, top.indices, top.values).sigmoid().transpose(0, 1)
    routed = x.repeat(LLAMA4_EXPERTS, 1) * scores.reshape(-1, 1)
    return routed.view(LLAMA4_EXPERTS, tokens, HIDDEN), torch.randn(LLAMA4_EXPERTS, HIDDEN, WIDTH, generator=generator)


def test_a_batched_gemm_over_every_expert_records_and_replays_its_zero_rows(tmp_path: Path) -> None:
    """Each expert multiplies every token, those routed elsewhere zeroed: 3 of 4 rows zero."""
    routed, weights = llama4_expert_inputs(16)
    trace = tmp_path / "trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with capture_input_values(tmp_path / "trace.values.json"):
            torch.bmm(routed, weights)
    prof.export_chrome_trace(str(trace))
    (call,) = read_values_file(tmp_path / "trace.values.json").calls.values()
    assert call.function == "torch.bmm" and call.zeros == {0: 0.75, 1: 0.0}
    ingest_path(trace, tmp_path / "db")
    with (tmp_path / "db" / "BatchMatMulV2.csv").open(newline="") as handle:
        (row,) = csv.DictReader(handle)
    assert parse_zero_shares_cell(row[PROFILING_INPUT_ZERO_SHARES]) == (0.75, 0.0)
    a, b = replay_of("BatchMatMulV2").make_inputs(kernel_row("BatchMatMulV2", row), torch.device("cpu"),
                                                  torch.Generator().manual_seed(0))
    assert int((a == 0).sum()) == routed.numel() * 3 // 4 and int((b == 0).sum()) == 0
    replay_on_cpu("BatchMatMulV2", row)


def test_a_large_operand_is_read_in_blocks_of_rows_for_its_zero_share(tmp_path: Path) -> None:
    routed, weights = llama4_expert_inputs(1024, seed=1)  # 256 K elements: past what is copied whole
    with capture_input_values(tmp_path / "run.values.json") as capture:
        routed.bmm(weights)
    share = capture.values.calls["0"].zeros[0]
    assert routed.numel() > 65536 and share == pytest.approx(0.75, abs=0.05)
