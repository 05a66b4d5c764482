"""``Profiling Input Distinct Shares``: how many distinct rows a gather's index read in the model,
recorded by the capture, carried by the ingested ``aten.index`` rows and drawn by their replay.

An MoE layer that sorts its (token, slot) pairs by expert gathers its tokens twice: the dispatch
``hidden[perm // k]`` reads each routed token k times, the combine ``out[inverse_perm]`` reads every
row once.  The replay's default index, drawn uniformly with repetition, reads about 63 % of the rows
of a permutation.  A real capture and a real CPU trace of such a layer here.
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
from perf_plugin.database.schema import PROFILING_INPUT_DISTINCT_SHARES
from perf_plugin.database.shares_cell import parse_shares_cell
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.trace.values_file import read_values_file
from tests.kernels.support import kernel_row, replay_of, replay_on_cpu

TOKENS, HIDDEN, EXPERTS, TOP_K = 48, 16, 8, 2


def routed_layer(folder: Path) -> tuple[Path, float]:
    """Profile, with the capture, the gathers of a routed MoE layer (and a slice, a mask and a
    strided index, which it leaves alone); the trace, and the dispatch's share of distinct values."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(TOKENS, HIDDEN, generator=generator)
    # a skewed router: token t's first choice is expert t % 2, so tokens repeat within experts
    ids = torch.stack([torch.arange(TOKENS) % 2, 2 + torch.arange(TOKENS) % (EXPERTS - 2)], dim=1)
    ids[: TOKENS // 4, 1] = 2  # and a quarter of them pick expert 2 second
    trace = folder / "trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with capture_input_values(folder / "trace.values.json"):
            _, perm = torch.sort(ids.reshape(-1), stable=True)
            routed = hidden[perm // TOP_K]  # the dispatch: every token TOP_K times
            out = routed * 2.0
            inverse = torch.empty_like(perm)
            inverse[perm] = torch.arange(perm.numel())
            back = out[inverse]  # the combine: a permutation
            back[:, :4].sum()  # a slice: not watched
            back[back[:, 0] > 0].sum()  # a boolean mask: not watched
            hidden[ids[:, 0]].sum()  # a strided index (a copy would launch a kernel): not watched
    prof.export_chrome_trace(str(trace))
    dispatch = len(set((perm // TOP_K).tolist())) / perm.numel()
    return trace, dispatch


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    return routed_layer(tmp_path_factory.mktemp("layer"))


def index_rows(database: Path) -> dict[str, dict[str, str]]:
    """The gathers by an integer index (the mask's row, of BOOL, left out), by input shapes."""
    with (database / "aten.index.csv").open(newline="", encoding="utf-8") as handle:
        return {row["Input Shapes"]: row for row in csv.DictReader(handle) if "BOOL" not in row["Input Data Types"]}


def test_the_capture_records_the_share_of_distinct_rows_each_gather_read(layer: tuple[Path, float]) -> None:
    trace, dispatch = layer
    calls = read_values_file(trace.with_name("trace.values.json")).calls
    # two gathers by a contiguous integer index; the slice, the mask and the strided index ran without a range
    assert sorted(call.distinct[1] for call in calls.values()) == [dispatch, 1.0]
    assert dispatch == pytest.approx(1 / TOP_K)
    marks = [e for e in json.loads(trace.read_text())["traceEvents"] if str(e.get("name", "")).startswith("perf_values/")]
    assert len(marks) == 2


def test_ingest_gives_each_gather_row_its_share_and_the_replay_reads_as_many_rows(
        layer: tuple[Path, float], tmp_path: Path) -> None:
    trace, dispatch = layer
    ingest_path(trace, tmp_path / "db")
    rows = index_rows(tmp_path / "db")
    pairs = TOKENS * TOP_K
    dispatch_row, combine_row = rows[f'"{TOKENS},{HIDDEN};{pairs}"'], rows[f'"{pairs},{HIDDEN};{pairs}"']
    assert parse_shares_cell(dispatch_row[PROFILING_INPUT_DISTINCT_SHARES]) == (None, dispatch)
    assert parse_shares_cell(combine_row[PROFILING_INPUT_DISTINCT_SHARES]) == (None, 1.0)
    replay = replay_of("aten.index")
    for row, distinct in ((dispatch_row, TOKENS), (combine_row, pairs)):
        args = replay.make_inputs(kernel_row("aten.index", row), torch.device("cpu"), torch.Generator().manual_seed(0))
        index = args[3][1]
        assert index.numel() == pairs and len(set(index.tolist())) == distinct
        assert max(index.bincount().tolist()) == pairs // distinct  # each row as often as the others
        replay_on_cpu("aten.index", row)  # and the gather replays and verifies
    # without the cell, the default draw repeats rows of the permutation
    bare = {k: v for k, v in combine_row.items() if k != PROFILING_INPUT_DISTINCT_SHARES}
    args = replay.make_inputs(kernel_row("aten.index", bare), torch.device("cpu"), torch.Generator().manual_seed(0))
    assert len(set(args[3][1].tolist())) < pairs


def test_a_share_that_is_no_share_is_refused_with_its_column(layer: tuple[Path, float], tmp_path: Path) -> None:
    trace, _ = layer
    ingest_path(trace, tmp_path / "db")
    row = next(iter(index_rows(tmp_path / "db").values()))
    bad = kernel_row("aten.index", {**row, PROFILING_INPUT_DISTINCT_SHARES: ";1.5"})
    with pytest.raises(CaseBuildError, match=f"'{PROFILING_INPUT_DISTINCT_SHARES}' slot 1: '1.5' is not a share"):
        replay_of("aten.index").make_inputs(bad, torch.device("cpu"), torch.Generator().manual_seed(0))


def test_a_values_file_with_a_distinct_share_out_of_range_names_the_call(tmp_path: Path) -> None:
    path = tmp_path / "run.values.json"
    path.write_text(json.dumps({"format": "perf-plugin input values", "version": 1, "token": "t",
                                "calls": {"4": {"function": "torch.Tensor.__getitem__", "values": {},
                                                "distinct": {"1": 0.0}}}}))
    with pytest.raises(DatabaseError, match="call '4': distinct shares must be numbers above 0, at most 1"):
        read_values_file(path)
