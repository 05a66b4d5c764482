"""Code reuse distances of traced operators: distinct kernels since their kernels last ran,
ingest writing them, and the replay keeping a row's code cached from them."""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import pytest
import torch

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import CODE_REUSE_CAP, PROFILING_COUNT
from perf_plugin.ingest.code_reuse import code_reuse_distances
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.code_eviction import CODE_CACHED_KERNELS, CODE_REUSE_COLUMN, code_cached
from perf_plugin.replay.tensors import KernelRow, kernel_row_from_cells
from perf_plugin.results import CaseRef
from perf_plugin.run.cases import STATUS_READY, Case
from perf_plugin.run.runner import CaseFailure, ReplayRunner
from tests.test_cache_modes import RecordingCollector, SmallCacheCpu

FIXTURES = Path(__file__).parent / "fixtures"
CAP = float(CODE_REUSE_CAP)


def _same(found: list[float], expected: list[float]) -> bool:
    return len(found) == len(expected) and all(
        (math.isnan(f) and math.isnan(e)) or f == e for f, e in zip(found, expected))


def test_a_kernel_counts_the_distinct_kernels_since_it_last_ran() -> None:
    calls = [["a"], ["b"], ["b"], ["c"], ["a"], ["a"]]
    nan = math.nan  # a kernel's first launch in the profile: what ran before it is unknown
    assert _same(code_reuse_distances(calls), [nan, nan, 0.0, nan, 2.0, 0.0])  # b and c once each; then none


def test_a_call_of_several_kernels_takes_its_farthest() -> None:
    calls = [["a"], ["b"], ["c"], ["d"], ["c", "a"], ["e", "a"], ["a", "f"]]  # c: d since; a: b, c, d since
    assert _same(code_reuse_distances(calls)[-3:], [3.0, math.nan, math.nan])  # a kernel without history: none


def test_distances_stop_at_the_cap_and_a_call_without_kernels_has_none() -> None:
    calls = [["x"], *[[f"k{i}"] for i in range(CODE_REUSE_CAP + 10)], ["x"], []]
    assert _same(code_reuse_distances(calls)[-2:], [CAP, math.nan])


def test_the_counts_equal_a_direct_count_on_random_sequences() -> None:
    rng = random.Random(3)
    calls = [[f"k{rng.randrange(12)}" for _ in range(rng.randrange(1, 3))] for _ in range(400)]
    launches = [name for call in calls for name in call]
    expected, position = [], 0
    for call in calls:
        counts = []
        for name in call:
            before = [i for i in range(position) if launches[i] == name]
            counts.append(min(CODE_REUSE_CAP, len(set(launches[before[-1] + 1 : position]))) if before else None)
            position += 1
        expected.append(math.nan if None in counts else float(max(c for c in counts if c is not None)))
    assert _same(code_reuse_distances(calls), expected)


def test_ingest_of_a_real_cuda_trace_writes_the_average_per_row(tmp_path: Path) -> None:
    """The H100 indexing trace: three randint calls in a row, the last launching the kernel the
    one before it did; a row of one call whose kernel ran for the first time has no value."""
    ingest_path(FIXTURES / "cuda" / "indexing_trace.json", tmp_path)
    with (tmp_path / "aten.randint.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        cells = [row[CODE_REUSE_COLUMN] for row in reader]
    assert header.index(CODE_REUSE_COLUMN) < header.index(PROFILING_COUNT)  # a counter: before the count
    assert "" in cells and "0" in cells
    assert all(0.0 <= float(cell) <= CAP for cell in cells if cell)


def test_a_cpu_trace_has_no_code_reuse_column(tmp_path: Path) -> None:
    ingest_path(FIXTURES / "cpu" / "indexing_trace.json", tmp_path)
    for path in tmp_path.glob("*.csv"):
        assert CODE_REUSE_COLUMN not in path.read_text().splitlines()[0]


def _row(cell: str) -> KernelRow:
    cells = {"Input Shapes": '"1,8,1,128;1,1,1,128"', "Input Data Types": "FLOAT;FLOAT", "Input Formats": "ND;ND",
             "Output Shapes": '"1,8,1,128"', "Output Data Types": "FLOAT", "Output Formats": "ND",
             CODE_REUSE_COLUMN: cell}
    return kernel_row_from_cells("Mul", cells)


@pytest.mark.parametrize(("cell", "cached"), [("", False), ("2.5", True), (str(CODE_CACHED_KERNELS), True),
                                              ("6.5", False), ("64", False)])
def test_a_row_keeps_its_code_cached_when_its_model_ran_few_kernels_in_between(cell: str, cached: bool) -> None:
    assert code_cached(_row(cell)) is cached


def _before_repeat_of(row: KernelRow, mode: str) -> object:
    recording = RecordingCollector()
    runner = ReplayRunner(SmallCacheCpu(4096), collector=recording, repeat_count=2, warmup_count=0,  # type: ignore[arg-type]
                          cache_mode=mode)
    runner.run(Case(CaseRef("rope", "Mul", "Mul.csv", 4, "Mul"), STATUS_READY, row=row, profiled_us=2.0))
    return recording.before_repeat["rope"]


@pytest.mark.parametrize("mode", ["produced", "idle", "cold"])
def test_the_runner_evicts_code_only_for_rows_whose_model_found_it_evicted(mode: str) -> None:
    on_code_shape = []
    for cell in ("2.5", "30"):
        before_repeat = _before_repeat_of(_row(cell), mode)
        assert callable(before_repeat)
        with torch.autograd.profiler.profile(record_shapes=True) as prof:
            before_repeat()
        shape = list(SmallCacheCpu.code_eviction_shape)
        on_code_shape.append(sum(1 for e in prof.function_events if e.input_shapes[:1] == [shape]))
    assert on_code_shape[0] == 0 and on_code_shape[1] >= 42


def test_a_bad_code_reuse_cell_fails_the_case_naming_file_row_and_column() -> None:
    with pytest.raises(CaseFailure) as failure:
        _before_repeat_of(_row("often"), "produced")
    assert all(part in str(failure.value) for part in ("Mul.csv", "4", CODE_REUSE_COLUMN, "'often'"))


def test_a_bad_cell_read_directly_is_a_database_error_naming_the_column() -> None:
    with pytest.raises(DatabaseError) as error:
        code_cached(_row("often"))
    assert error.value.column == CODE_REUSE_COLUMN


def test_a_bad_code_reuse_cell_fails_no_case_timed_warm() -> None:
    assert _before_repeat_of(_row("often"), "warm") is None
