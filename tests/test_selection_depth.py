"""How close a top-k's k-th value lies to its row (its selection depth): computed on real values,
captured in a real profiled router on the CPU, carried by the row (``Profiling Selection
Depths``), and rebuilt by the replay."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.capture import capture_input_values
from perf_plugin.capture.selection_depth import (
    depth_histogram,
    depths_for_rows,
    ordered_key,
    row_depths,
    rows_along,
    value_of_key,
    width_of,
    with_depth,
)
from perf_plugin.database.depths_cell import depths_cell, parse_depths_cell
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import PROFILING_INPUT_QUANTILES, PROFILING_SELECTION_DEPTHS
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.trace.values_file import CapturedCall, CapturedValues, read_values_file, write_values_file
from tests.kernels.support import kernel_row, replay_of, replay_on_cpu

TOKENS, EXPERTS, K = 512, 8, 2


def router_scores(seed: int, tokens: int = TOKENS, experts: int = EXPERTS) -> torch.Tensor:
    """A router as Mixtral's: bfloat16 logits of normal hidden states, a float32 softmax.  Equal
    logits give equal scores, so some rows tie."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, 256, generator=generator).to(torch.bfloat16)
    weight = ((torch.rand(experts, 256, generator=generator) * 2 - 1) / 16).to(torch.bfloat16)
    return torch.softmax(hidden @ weight.t(), dim=-1, dtype=torch.float32)


# ----------------------------------------------------------------------------- the statistic
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_keys_sort_as_the_values_do_and_map_back(dtype: str) -> None:
    torch_dtype = getattr(torch, dtype)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-3, -65000.0], dtype=torch_dtype)
    values = torch.cat([torch.randn(300).to(torch_dtype), special]).tolist()
    by_key = sorted(values, key=lambda v: ordered_key(v, dtype))
    assert by_key == sorted(values)  # -0.0 before 0.0, which compare equal
    assert all(0 <= ordered_key(v, dtype) < 1 << width_of(dtype) for v in values)
    for value in values:  # the sign of a zero too
        assert str(value_of_key(ordered_key(value, dtype), dtype)) == str(value)


def test_a_rows_depth_is_the_bits_its_kth_value_shares_with_its_nearest_neighbour() -> None:
    # 0.75 = 0x3F400000, 0.625 = 0x3F200000: the keys share their 9 bits of sign and exponent,
    # and their fractions differ at the first bit
    assert row_depths([[0.75, 0.625, 0.1]], 1, True, "float32") == [9]
    assert row_depths([[0.75, 0.625, 0.625]], 2, True, "float32") == [32]  # a tie: the whole width
    assert row_depths([[0.75, 0.625, 0.625]], 2, True, "bfloat16") == [16]
    assert row_depths([[0.9, 0.75, 0.625]], 1, False, "float32") == [9]  # the smallest, likewise
    assert row_depths([[0.5, 0.25]], 2, True, "float32") == []  # k = all: nothing to set apart
    scores = router_scores(0)
    histogram = depth_histogram(scores.tolist(), K, True, "float32")
    assert sum(histogram.values()) == TOKENS and histogram.get(32, 0) > 0  # bfloat16 logits tie


def test_rows_along_a_dim_are_the_tensors_slices() -> None:
    x = torch.arange(24.0).reshape(2, 3, 4)
    for dim in range(3):
        expected = x.movedim(dim, -1).reshape(-1, x.shape[dim]).tolist()
        assert rows_along(x.flatten().tolist(), x.shape, dim) == expected


@pytest.mark.parametrize(("dtype", "experts", "k", "largest"),
                         [("float32", 8, 2, True), ("float32", 64, 8, False), ("bfloat16", 40, 8, True),
                          ("float16", 16, 1, True), ("float32", 8, 7, True)])
def test_a_row_is_rebuilt_to_any_depth_its_values_allow(dtype: str, experts: int, k: int, largest: bool) -> None:
    rows = router_scores(1, tokens=16, experts=experts).to(getattr(torch, dtype)).tolist()
    width = width_of(dtype)
    for row in rows:
        for depth in range(1, width + 1):
            rebuilt = with_depth(row, k, largest, dtype, depth)
            assert row_depths([rebuilt], k, largest, dtype) == [depth]
            assert float(torch.tensor(rebuilt).isfinite().all())
            # the k-th value stays where it was; a neighbour moves, never across it, but where
            # it has no neighbour on the side it must come from
            kth = sorted(row, reverse=largest)[k - 1]
            assert sorted(rebuilt, reverse=largest)[k - 1] == kth or k in (1, len(row) - 1)


def test_a_row_that_cannot_reach_a_depth_comes_back_as_it_was() -> None:
    row = [0.5, 0.25, 0.125]
    # depth 0 is a neighbour across the sign: not reachable while the larger values stay larger
    assert with_depth(row, 2, True, "float32", 0) == row
    assert with_depth(row, 3, True, "float32", 12) == row  # k = all


def test_depths_are_dealt_to_rows_at_even_ranks_of_the_recorded_rows() -> None:
    assert depths_for_rows({10: 500, 32: 12}, 512) == [10] * 500 + [32] * 12  # as many rows: as recorded
    assert depths_for_rows({9: 1, 10: 1, 11: 1, 13: 1}, 1) == [11]  # one row: the median row's
    two_calls = Counter(depths_for_rows({10: 1020, 32: 4}, 512))  # two calls of 512, 2 tied rows each
    assert two_calls == {10: 510, 32: 2}
    assert depths_for_rows({}, 8) == [] and depths_for_rows({10: 3}, 0) == []


# ----------------------------------------------------------------------------- the cell and the file
def test_the_cell_sums_its_calls_and_a_bad_one_is_refused() -> None:
    assert depths_cell([{0: {10: 500, 32: 12}}, {}, {0: {10: 510, 11: 2}}]) == "10:1010,11:2,32:12"
    assert depths_cell([{1: {9: 4}}]) == ";9:4" and depths_cell([{}, {}]) == ""
    assert parse_depths_cell(";9:4,32:1") == (None, {9: 4, 32: 1}) and parse_depths_cell("") == ()
    for bad in ("9", "9:0", "9:1,9:2", "a:1", "-1:3"):
        with pytest.raises(DatabaseError, match="slot 0"):
            parse_depths_cell(bad)


def test_depths_survive_the_values_file_and_bad_ones_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.values.json"
    write_values_file(path, CapturedValues("t", {"0": CapturedCall("torch.topk", {}, {}, {0: {10: 6, 32: 2}})}))
    assert read_values_file(path).calls["0"].depths == {0: {10: 6, 32: 2}}
    document = json.loads(path.read_text())
    document["calls"]["0"]["depths"]["0"] = {"10": 0}
    path.write_text(json.dumps(document))
    with pytest.raises(DatabaseError, match="call '0': depths must"):
        read_values_file(path)


# ----------------------------------------------------------------------------- capture and ingest
def profile_routers(directory: Path) -> tuple[Path, list[dict[int, int]]]:
    """Two routers' top-2 of one shape, a top-3 along dim 0 and a smallest-first top-k, captured."""
    first, second = router_scores(1), router_scores(2)
    trace = directory / "trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with capture_input_values(directory / "trace.values.json"):
            torch.topk(first, K, dim=-1)
            second.topk(K)
            torch.topk(first, 3, 0)
            torch.topk(second, k=1, dim=-1, largest=False)
    prof.export_chrome_trace(str(trace))
    expected = [depth_histogram(first.tolist(), K, True, "float32"), depth_histogram(second.tolist(), K, True, "float32"),
                depth_histogram(first.t().tolist(), 3, True, "float32"), depth_histogram(second.tolist(), 1, False, "float32")]
    return trace, expected


def test_the_capture_records_each_top_k_calls_depths_along_its_dim(tmp_path: Path) -> None:
    _, expected = profile_routers(tmp_path)
    calls = read_values_file(tmp_path / "trace.values.json").calls
    assert [call.depths for call in calls.values()] == [{0: histogram} for histogram in expected]
    assert sum(expected[2].values()) == EXPERTS  # along dim 0: one row per expert


def test_ingest_sums_the_calls_depths_on_the_row(tmp_path: Path) -> None:
    trace, expected = profile_routers(tmp_path)
    ingest_path(trace, tmp_path / "db")
    with (tmp_path / "db" / "aten.topk.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    header = list(rows[0])
    assert header.index(PROFILING_SELECTION_DEPTHS) == header.index(PROFILING_INPUT_QUANTILES) + 1
    (routers,) = [row for row in rows if row["Profiling Count"] == "2"]  # both top-2 calls: one row
    assert parse_depths_cell(routers[PROFILING_SELECTION_DEPTHS]) == (dict(Counter(expected[0]) + Counter(expected[1])),)


# ----------------------------------------------------------------------------- the replay
def _topk_cells(depths: str, k: int = K) -> dict[str, str]:
    scores = router_scores(3)
    quantiles = ",".join(f"{q:.7g}" for q in scores.flatten().quantile(torch.linspace(0, 1, 17)).tolist())
    return {"Input Shapes": f'"{TOKENS},{EXPERTS}"', "Input Data Types": "FLOAT", "Input Formats": "ND",
            "Output Shapes": f'"{TOKENS},{k};{TOKENS},{k}"', "Output Data Types": "FLOAT;INT64",
            "Output Formats": "ND;ND",
            "Op Arguments": f'{{"overload":"default","args":[{{"tensor":0}},{k},-1,true,true]}}',
            PROFILING_INPUT_QUANTILES: quantiles, PROFILING_SELECTION_DEPTHS: depths}


def test_the_replay_rebuilds_its_drawn_rows_to_the_recorded_depths() -> None:
    recorded = depth_histogram(router_scores(3).tolist(), K, True, "float32")
    row = kernel_row("aten.topk", _topk_cells(depths_cell([{0: recorded}])))
    _, _, _, tensors, _ = replay_of("aten.topk").make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert depth_histogram(tensors[0].tolist(), K, True, "float32") == recorded
    plain = kernel_row("aten.topk", _topk_cells(""))
    _, _, _, drawn, _ = replay_of("aten.topk").make_inputs(plain, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert depth_histogram(drawn[0].tolist(), K, True, "float32").get(32, 0) == 0  # drawn alone: no row ties
    replay_on_cpu("aten.topk", _topk_cells(depths_cell([{0: recorded}])))  # ties verify


def test_the_npu_top_k_rebuilds_its_rows_too() -> None:
    cells = {"Input Shapes": f'"{TOKENS},{EXPERTS};"', "Input Data Types": "FLOAT;INT32",
             "Input Formats": "FORMAT_ND;FORMAT_ND", "Output Shapes": f'"{TOKENS},{K};{TOKENS},{K}"',
             "Output Data Types": "FLOAT;INT32", "Output Formats": "FORMAT_ND;FORMAT_ND",
             PROFILING_INPUT_QUANTILES: _topk_cells("")[PROFILING_INPUT_QUANTILES],
             PROFILING_SELECTION_DEPTHS: f"11:{TOKENS - 5},32:5"}
    x, k = replay_of("TopKV2").make_inputs(kernel_row("TopKV2", cells), torch.device("cpu"), torch.Generator().manual_seed(0))
    assert k == K and depth_histogram(x.tolist(), K, True, "float32") == {11: TOKENS - 5, 32: 5}
    replay_on_cpu("TopKV2", cells)


def test_a_bad_depths_cell_is_refused_naming_the_column_and_slot() -> None:
    row = kernel_row("aten.topk", _topk_cells("10:x"))
    with pytest.raises(CaseBuildError, match=f"'{PROFILING_SELECTION_DEPTHS}' slot 0"):
        replay_of("aten.topk").make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
