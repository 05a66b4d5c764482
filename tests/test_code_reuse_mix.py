"""Rows whose calls found their code cached some of the time: ingest's histogram of the calls'
code reuse distances, and the replay keeping the code cached on that share of its repeats."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.histogram_cell import histogram_text, parse_histogram
from perf_plugin.database.schema import PROFILING_CODE_REUSE, PROFILING_CODE_REUSE_DISTANCES, PROFILING_INPUT_REUSE_SPREAD
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.code_eviction import CODE_REUSE_COLUMN, CodeCache, code_states, interleaved
from perf_plugin.replay.tensors import KernelRow, kernel_row_from_cells
from perf_plugin.results import CaseRef
from perf_plugin.run.cases import STATUS_READY, Case
from perf_plugin.run.runner import CaseFailure, ReplayRunner
from tests.test_cache_modes import RecordingCollector, SmallCacheCpu

FIXTURES = Path(__file__).parent / "fixtures"
CACHE = 4096


def test_a_histogram_cell_round_trips_and_names_what_is_wrong() -> None:
    assert histogram_text({25: 3, 1: 8, 2: 16, 7: 0}) == "1:8,2:16,25:3"
    assert parse_histogram("1:8,2:16,25:3") == {1: 8, 2: 16, 25: 3}
    assert parse_histogram(" ") == {}
    for bad in ("1:8,1:2", "1:0", "-1:3", "often", "1:2:3"):
        with pytest.raises(DatabaseError, match="distance:calls"):
            parse_histogram(bad, "distance", "calls")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_ingest_of_a_real_cuda_trace_writes_each_rows_calls_by_distance(tmp_path: Path) -> None:
    """The H100 trace of three identical quantized residual layers: every call after the first
    has a distance, and the histogram's mean is the row's average distance."""
    ingest_path(FIXTURES / "cuda" / "quantize_residual_trace.json", tmp_path)
    checked = 0
    for path in tmp_path.glob("*.csv"):
        for row in _rows(path):
            average = row.get(CODE_REUSE_COLUMN, "")
            histogram = parse_histogram(row.get(PROFILING_CODE_REUSE_DISTANCES, ""))
            assert bool(average) == bool(histogram), (path.name, row)
            if histogram:
                calls = sum(histogram.values())
                assert calls <= int(row["Profiling Count"])
                mean = sum(distance * count for distance, count in histogram.items()) / calls
                assert mean == pytest.approx(float(average), abs=1e-4)
                checked += 1
    assert checked >= 5


def test_ingest_into_a_database_written_before_the_column_adds_it_last(tmp_path: Path) -> None:
    trace = FIXTURES / "cuda" / "quantize_residual_trace.json"
    ingest_path(trace, tmp_path)
    path = tmp_path / "Abs.csv"
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    position = rows[0].index(PROFILING_CODE_REUSE_DISTANCES)
    expected = rows[1][position]
    with path.open("w", newline="") as handle:  # as an earlier version wrote it
        csv.writer(handle).writerows([row[:position] + row[position + 1:] for row in rows])
    ingest_path(trace, tmp_path)
    (header, *values) = list(csv.reader(path.open(newline="")))
    assert header.index(PROFILING_CODE_REUSE_DISTANCES) > header.index(PROFILING_INPUT_REUSE_SPREAD)
    assert values[0][header.index(PROFILING_CODE_REUSE_DISTANCES)] == expected != ""


def _row(average: str, histogram: str, moved: str = "") -> KernelRow:
    cells = {"Input Shapes": '"1,8,1,128;1,1,1,128"', "Input Data Types": "FLOAT;FLOAT", "Input Formats": "ND;ND",
             "Output Shapes": '"1,8,1,128"', "Output Data Types": "FLOAT", "Output Formats": "ND",
             CODE_REUSE_COLUMN: average, PROFILING_CODE_REUSE: moved, PROFILING_CODE_REUSE_DISTANCES: histogram}
    return kernel_row_from_cells("Mul", cells)


@pytest.mark.parametrize(("average", "histogram", "share"), [
    ("5.5", "1:8,2:16,10:4,25:4", 0.75),  # rotary: three calls of four a kernel or two apart
    ("20", "2:1,30:1", 0.5),  # an average past the threshold, half the calls within it
    ("3", "30:2", 0.0),  # the histogram, not the average, decides
    ("6", "6:3", 1.0),  # the threshold itself is cached
    ("3", "", 1.0),  # a row written before the column: its average's state
    ("30", "", 0.0),
])
def test_the_share_of_calls_that_found_their_code_cached(average: str, histogram: str, share: float) -> None:
    assert code_states(_row(average, histogram), CACHE).cached_share == pytest.approx(share)


def test_the_others_find_their_code_where_the_bytes_moved_say() -> None:
    assert code_states(_row("20", "2:1,30:1", "100"), CACHE).uncached is CodeCache.LAST_LEVEL
    assert code_states(_row("20", "2:1,30:1", "4000"), CACHE).uncached is CodeCache.MEMORY
    assert code_states(_row("20", "2:2", "4000"), CACHE).uncached is CodeCache.INSTRUCTION  # every call cached


def test_a_bad_histogram_cell_is_an_error_naming_its_column() -> None:
    with pytest.raises(DatabaseError) as error:
        code_states(_row("3", "2:often"), CACHE)
    assert error.value.column == PROFILING_CODE_REUSE_DISTANCES


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 0.75, 1.0, 1 / 3])
def test_interleaved_runs_the_first_step_on_its_share_of_calls_spread_evenly(share: float) -> None:
    ran: list[str] = []
    step = interleaved(lambda: ran.append("a"), lambda: ran.append("b"), share)
    for _ in range(12):
        step()
    assert ran.count("a") == round(12 * share)
    positions = [i for i, name in enumerate(ran) if name == "a"]
    assert all(later - earlier >= int(1 / share) for earlier, later in zip(positions, positions[1:]))


def _code_evictions_per_repeat(row: KernelRow, repeats: int) -> list[int]:
    recording = RecordingCollector()
    runner = ReplayRunner(SmallCacheCpu(CACHE), collector=recording, repeat_count=2, warmup_count=0,  # type: ignore[arg-type]
                          cache_mode="produced")
    runner.run(Case(CaseRef("rope", "Mul", "Mul.csv", 4, "Mul"), STATUS_READY, row=row, profiled_us=2.0))
    before_repeat = recording.before_repeat["rope"]
    assert callable(before_repeat)
    shape = list(SmallCacheCpu.code_eviction_shape)
    counts = []
    for _ in range(repeats):
        with torch.autograd.profiler.profile(record_shapes=True) as prof:
            before_repeat()
        counts.append(sum(1 for event in prof.function_events if event.input_shapes[:1] == [shape]))
    return counts


def test_the_runner_evicts_the_code_before_the_share_of_repeats_whose_calls_found_it_evicted() -> None:
    counts = _code_evictions_per_repeat(_row("5.5", "1:8,2:16,10:4,25:4", "4000"), 8)
    evicted = [i for i, count in enumerate(counts) if count > 0]  # the run's own repeats came first
    assert len(evicted) == 2 and evicted[1] - evicted[0] == 4
    assert min(count for count in counts if count) >= 42  # a whole code eviction each time


def test_a_row_without_the_histogram_replays_its_averages_one_state() -> None:
    assert all(count == 0 for count in _code_evictions_per_repeat(_row("5.5", ""), 4))
    assert all(count >= 42 for count in _code_evictions_per_repeat(_row("30", "", "4000"), 4))


def test_a_bad_histogram_cell_fails_the_case_naming_file_row_and_column() -> None:
    with pytest.raises(CaseFailure) as failure:
        _code_evictions_per_repeat(_row("3", "2:often"), 1)
    assert all(part in str(failure.value) for part in ("Mul.csv", "4", PROFILING_CODE_REUSE_DISTANCES))
