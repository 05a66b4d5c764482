"""What top-k's time depends on beyond its shapes: how close its input values lie.  Captured in a
real profiled router on the CPU as quantiles, carried by the row (``Profiling Input Quantiles``),
and drawn from by the replay."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.capture import capture_input_values
from perf_plugin.capture.pending_copies import quantiles_of
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.quantiles_cell import parse_quantiles_cell, quantiles_cell
from perf_plugin.database.schema import PROFILING_INPUT_QUANTILES
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.verify import VerificationError
from perf_plugin.trace.values_file import QUANTILES, CapturedCall, CapturedValues, read_values_file, write_values_file
from tests.kernels.support import kernel_row, replay_of, replay_on_cpu

TOKENS, EXPERTS = 64, 8


def router_scores(spread: float, seed: int) -> torch.Tensor:
    """A router's probabilities: a softmax of logits ``spread`` apart (near-equal for small ``spread``)."""
    logits = torch.randn(TOKENS, EXPERTS, generator=torch.Generator().manual_seed(seed)) * spread
    return torch.softmax(logits, dim=-1)


def profile_routing(directory: Path, capture: bool) -> tuple[Path, list[torch.Tensor]]:
    """Two routers of one shape, one through ``torch.topk`` and one through ``Tensor.topk``, and a
    strided view of scores (not copied: that would launch a gathering kernel in the step)."""
    first, second = router_scores(0.01, seed=1), router_scores(0.01, seed=2)
    strided = torch.rand(EXPERTS, TOKENS).t()
    trace = directory / "trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with capture_input_values(directory / "trace.values.json" if capture else None):
            torch.topk(first, 2, dim=-1)
            second.topk(2, dim=-1)
            strided.topk(2, dim=-1)
    prof.export_chrome_trace(str(trace))
    return trace, [first, second]


def topk_rows(db: Path) -> list[dict[str, str]]:
    with (db / "aten.topk.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_capture_records_each_top_k_input_as_its_quantiles(tmp_path: Path) -> None:
    _, scores = profile_routing(tmp_path, capture=True)
    calls = json.loads((tmp_path / "trace.values.json").read_text())["calls"]
    recorded = [call for call in calls.values() if call.get("quantiles")]
    assert [call["function"] for call in recorded] == ["torch.topk", "torch.Tensor.topk"]
    for call, values in zip(recorded, scores):
        expected = quantiles_of(values.flatten().tolist())
        assert call["quantiles"]["0"] == pytest.approx(list(expected))
        assert expected[0] == values.min().item() and expected[-1] == values.max().item()
    strided_call = [call for call in calls.values() if call["function"] == "torch.Tensor.topk"][-1]
    assert "quantiles" not in strided_call


def test_ingest_carries_the_median_quantiles_on_the_row(tmp_path: Path) -> None:
    trace, scores = profile_routing(tmp_path, capture=True)
    ingest_path(trace, tmp_path / "db")
    contiguous, strided = sorted(topk_rows(tmp_path / "db"), key=lambda row: row.get("Input Strides", ""))
    assert contiguous["Profiling Count"] == "2"  # both routers: one shape, one row
    (cell,) = parse_quantiles_cell(contiguous[PROFILING_INPUT_QUANTILES])
    per_call = [quantiles_of(values.flatten().tolist()) for values in scores]
    assert cell == pytest.approx([min(a, b) for a, b in zip(*per_call)], rel=1e-6)  # the lower median
    assert cell[-1] - cell[0] < 0.01  # near-equal probabilities, as the router gave them
    assert strided[PROFILING_INPUT_QUANTILES] == ""


def test_a_later_capture_adds_the_column_to_rows_ingested_without_it(tmp_path: Path) -> None:
    db = tmp_path / "db"
    trace, _ = profile_routing(tmp_path, capture=False)
    ingest_path(trace, db)
    assert PROFILING_INPUT_QUANTILES not in topk_rows(db)[0]
    trace, _ = profile_routing(tmp_path, capture=True)
    ingest_path(trace, db)
    assert any(row[PROFILING_INPUT_QUANTILES] for row in topk_rows(db))


def _topk_cells(quantiles: str) -> dict[str, str]:
    return {"Input Shapes": f'"{TOKENS},{EXPERTS}"', "Input Data Types": "FLOAT", "Input Formats": "ND",
            "Output Shapes": f'"{TOKENS},2;{TOKENS},2"', "Output Data Types": "FLOAT;INT64", "Output Formats": "ND;ND",
            "Op Arguments": '{"overload":"default","args":[{"tensor":0},2,-1,true,true]}',
            PROFILING_INPUT_QUANTILES: quantiles}


def _drawn_input(quantiles: str) -> torch.Tensor:
    replay = replay_of("aten.topk")
    row = kernel_row("aten.topk", _topk_cells(quantiles))
    _, _, _, tensors, _ = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    return tensors[0]


def test_the_replay_draws_top_k_input_from_the_rows_quantiles() -> None:
    close = ",".join(f"{0.12 + i * 0.0005:.4f}" for i in range(QUANTILES))
    drawn = _drawn_input(close)
    assert 0.12 <= drawn.min().item() and drawn.max().item() <= 0.128
    assert drawn.unique().numel() > TOKENS  # spread between the quantiles, not only on them
    tied = _drawn_input(",".join(["0.125"] * QUANTILES))
    assert tied.unique().tolist() == [0.125]  # equal values in the model are ties in the replay
    default = _drawn_input("")
    assert 0.25 <= default.min().item() and default.max().item() <= 0.95  # the default range
    replay_on_cpu("aten.topk", _topk_cells(",".join(["0.125"] * QUANTILES)))  # ties verify


def test_scores_masked_to_minus_infinity_are_drawn_as_minus_infinity() -> None:
    """DeepSeek-V3's routing masks the experts of unchosen groups to -inf before its top-k."""
    masked = ",".join(["-inf"] * 8 + [f"{0.2 + i * 0.05:.2f}" for i in range(QUANTILES - 8)])
    drawn = _drawn_input(masked)
    share = (drawn == -math.inf).float().mean().item()
    assert 0.4 < share < 0.55 and not drawn.isnan().any()
    assert drawn[drawn.isfinite()].min().item() >= 0.2
    replay_on_cpu("aten.topk", _topk_cells(masked))


def test_a_bad_quantiles_cell_is_refused_naming_the_column_and_slot() -> None:
    with pytest.raises(CaseBuildError, match=f"'{PROFILING_INPUT_QUANTILES}' slot 0"):
        _drawn_input("0.3,0.2")
    with pytest.raises(DatabaseError, match="slot 1: 'x'"):
        parse_quantiles_cell("0.1,0.2;x")


def test_the_cell_is_each_quantiles_median_over_the_calls_that_recorded_it() -> None:
    calls = [{0: (1.0, 2.0, 4.0)}, {0: (3.0, 4.0, 8.0)}, {}, {0: (2.0, 3.0, 5.0)}]
    assert quantiles_cell(calls) == "2,3,5"
    masked = [{0: (-math.inf, 0.5, 1.0)}, {0: (-math.inf, 0.25, 2.0)}]
    assert quantiles_cell(masked) == "-inf,0.25,1"  # a value some call had, never a mean with -inf
    assert quantiles_cell([{1: (0.5, 1.0)}]) == ";0.5,1" and quantiles_cell([{}, {}]) == ""
    assert parse_quantiles_cell(";0.5,1") == (None, (0.5, 1.0))


def test_quantiles_survive_the_values_file_and_bad_ones_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.values.json"
    quantiles = tuple(float(i) for i in range(QUANTILES))
    write_values_file(path, CapturedValues("t", {"0": CapturedCall("torch.topk", {}, {0: quantiles})}))
    assert read_values_file(path).calls["0"].quantiles == {0: quantiles}
    document = json.loads(path.read_text())
    document["calls"]["0"]["quantiles"]["0"] = list(reversed(quantiles))
    path.write_text(json.dumps(document))
    with pytest.raises(DatabaseError, match="call '0': quantiles must be"):  # descending
        read_values_file(path)


# The real Level1 profile's TopKV2 row (tests/fixtures/ascend/kernel_details_level1.csv): top-5
# of 1000 classes for 32 images, the kernel's INT32 indices.
_TOPKV2 = {"Input Shapes": '"32,1000;"', "Input Data Types": "FLOAT;INT32", "Input Formats": "FORMAT_ND;FORMAT_ND",
           "Output Shapes": '"32,5;32,5"', "Output Data Types": "FLOAT;INT32", "Output Formats": "FORMAT_ND;FORMAT_ND"}


def test_the_npu_top_k_draws_from_the_rows_quantiles_and_verifies_with_ties() -> None:
    """``TopKV2`` (the NPU route of ``torch.topk``) with a capture's quantiles: its input drawn from
    them, ties included, and verified as any correct selection (any tied index is right)."""
    tied = ",".join(["0.5"] * (QUANTILES - 2) + ["0.75", "1.0"])
    replay = replay_of("TopKV2")
    row = kernel_row("TopKV2", {**_TOPKV2, PROFILING_INPUT_QUANTILES: tied})
    x, k = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert tuple(x.shape) == (32, 1000) and k == 5
    assert 0.5 <= x.min().item() and x.max().item() <= 1.0 and (x == 0.5).float().mean().item() > 0.8
    replay_on_cpu("TopKV2", {**_TOPKV2, PROFILING_INPUT_QUANTILES: tied})
    # another kernel's choice among tied values is right; an index of another value, or one
    # picked twice, is not
    x[0] = 0.5  # a row whose values all tie
    values, indices = replay.run(x, k)
    other = indices.clone()
    other[0] = torch.arange(1000 - k, 1000)
    assert not torch.equal(other, indices)
    assert torch.equal(replay.comparable((x, k), (values, other))[1], replay.comparable((x, k), (values, indices))[1])
    wrong = indices.clone()
    wrong[1, 0] = (x[1] < values[1, -1]).nonzero()[0, 0]
    assert not torch.equal(replay.comparable((x, k), (values, wrong))[1], replay.comparable((x, k), (values, indices))[1])
    repeated = indices.clone()
    repeated[0, 1] = repeated[0, 0]
    with pytest.raises(VerificationError, match="an index repeats"):
        replay.comparable((x, k), (values, repeated))
    # without the cell: distinct values, as before
    plain, _ = replay.make_inputs(kernel_row("TopKV2", _TOPKV2), torch.device("cpu"), torch.Generator().manual_seed(0))
    assert all(row.unique().numel() == 1000 for row in plain)


def test_a_top_k_input_larger_than_a_copy_is_read_in_blocks_of_its_rows(tmp_path: Path) -> None:
    """Qwen3-Next's router: the top-10 of 512 experts' scores over 512 tokens (262144 values, past
    what is copied whole): quantiles and selection depths come from blocks of whole rows."""
    from perf_plugin.capture.selection_depth import depth_histogram

    logits = torch.randn(512, 512, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    scores = torch.softmax(logits.float(), dim=-1).to(torch.bfloat16)  # ties in bf16, as a router's
    with capture_input_values(tmp_path / "run.values.json") as capture:
        scores.topk(10, dim=-1)
        scores.topk(10, dim=0)  # along the columns: no blocks of whole rows to read
    along_rows, along_columns = capture.values.calls["0"], capture.values.calls["1"]
    assert along_columns.quantiles == {} and along_columns.depths == {}
    (recorded,) = along_rows.quantiles.values()
    whole = quantiles_of(scores.flatten().float().tolist())
    assert recorded[QUANTILES // 2] == pytest.approx(whole[QUANTILES // 2], rel=0.05)  # the median, from a sample
    (depths,) = along_rows.depths.values()
    assert 32 <= sum(depths.values()) < 512  # rows read, not all of them
    every_row = depth_histogram(scores.float().tolist(), 10, True, "bfloat16")
    assert max(depths) <= max(every_row) and set(depths) <= set(every_row)
