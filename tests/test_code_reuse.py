"""Code reuse distances of traced operators: distinct kernels, and bytes moved, since their
kernels last ran; ingest writing them; and the replay leaving a row's code where they say."""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import CODE_REUSE_CAP, PROFILING_CODE_REUSE, PROFILING_COUNT, PROFILING_INPUT_REUSE
from perf_plugin.ingest.code_reuse import code_reuse_bytes, code_reuse_distances
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.code_eviction import CODE_CACHED_KERNELS, CODE_REUSE_COLUMN, CodeCache, code_cache_state
from perf_plugin.trace.mapped import MappedOp, Slot
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


def test_ingest_writes_the_bytes_moved_since_a_kernels_previous_call(tmp_path: Path) -> None:
    """The H100 trace of three identical quantized residual layers: each kernel runs once a layer,
    so the bytes moved since its previous call began are one layer's traffic, whichever kernel."""
    ingest_path(FIXTURES / "cuda" / "quantize_residual_trace.json", tmp_path)
    per_layer = {}
    for name in ("Abs", "Add", "MatMulV2", "RmsNorm", "aten.amax"):
        with (tmp_path / f"{name}.csv").open(newline="") as handle:
            reader = csv.DictReader(handle)
            header = list(reader.fieldnames or [])
            (cells,) = list(reader)
        assert header.index(PROFILING_CODE_REUSE) == header.index(PROFILING_INPUT_REUSE) + 1
        assert cells[PROFILING_COUNT] == "3"  # the first call has no distance; the median is the other two's
        per_layer[name] = int(cells[PROFILING_CODE_REUSE])
    assert len(set(per_layer.values())) == 1, per_layer
    assert 130_000 < per_layer["Abs"] < 150_000  # a 256x256 bf16 weight and a few activations


def test_ingest_into_a_database_written_before_the_column_adds_it_beside_the_input_distances(tmp_path: Path) -> None:
    trace = FIXTURES / "cuda" / "quantize_residual_trace.json"
    ingest_path(trace, tmp_path)
    path = tmp_path / "Abs.csv"
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    expected = rows[1][rows[0].index(PROFILING_CODE_REUSE)]
    position = rows[0].index(PROFILING_CODE_REUSE)
    with path.open("w", newline="") as handle:  # as an earlier version wrote it
        csv.writer(handle).writerows([row[:position] + row[position + 1:] for row in rows])
    ingest_path(trace, tmp_path)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        (cells,) = list(reader)
    assert header.index(PROFILING_CODE_REUSE) == header.index(PROFILING_INPUT_REUSE) + 1
    assert cells[PROFILING_CODE_REUSE] == expected != ""


def test_a_cpu_trace_has_no_code_reuse_column(tmp_path: Path) -> None:
    ingest_path(FIXTURES / "cpu" / "indexing_trace.json", tmp_path)
    for path in tmp_path.glob("*.csv"):
        assert CODE_REUSE_COLUMN not in path.read_text().splitlines()[0]
        assert PROFILING_CODE_REUSE not in path.read_text().splitlines()[0]


def _row(cell: str, moved: str = "") -> KernelRow:
    cells = {"Input Shapes": '"1,8,1,128;1,1,1,128"', "Input Data Types": "FLOAT;FLOAT", "Input Formats": "ND;ND",
             "Output Shapes": '"1,8,1,128"', "Output Data Types": "FLOAT", "Output Formats": "ND",
             CODE_REUSE_COLUMN: cell, PROFILING_CODE_REUSE: moved}
    return kernel_row_from_cells("Mul", cells)


@pytest.mark.parametrize(("cell", "cached"), [("", False), ("2.5", True), (str(CODE_CACHED_KERNELS), True),
                                              ("6.5", False), ("64", False)])
def test_a_row_keeps_its_code_cached_when_its_model_ran_few_kernels_in_between(cell: str, cached: bool) -> None:
    assert (code_cache_state(_row(cell), 4096) is CodeCache.INSTRUCTION) is cached


@pytest.mark.parametrize(("cell", "moved", "state"), [
    ("30", "2047", CodeCache.LAST_LEVEL),  # under half the cache moved since the previous call
    ("30", "2048", CodeCache.MEMORY),
    ("30", "-", CodeCache.MEMORY),  # no earlier call in the profile
    ("30", "", CodeCache.MEMORY),  # no evidence
    ("", "100", CodeCache.LAST_LEVEL),  # a first launch among the kernels: the bytes still say
    ("2", "1000000", CodeCache.INSTRUCTION),  # few kernels in between: the instruction caches held it
])
def test_a_row_finds_its_code_in_the_last_level_cache_when_little_data_moved_in_between(
        cell: str, moved: str, state: CodeCache) -> None:
    assert code_cache_state(_row(cell, moved), 4096) is state


def _op(numel: int) -> MappedOp:
    return MappedOp("Add", inputs=(Slot((numel,), "float32"),), outputs=(Slot((numel,), "bfloat16"),))


def test_a_call_counts_the_bytes_moved_since_its_kernels_previous_call_began() -> None:
    calls = [["a"], ["b"], ["c"], ["a"], ["c", "b"], ["d"]]
    ops = [_op(n) for n in (1, 10, 100, 1000, 10000, 1)]  # 6 bytes per element: 4 read, 2 written
    found = code_reuse_bytes(calls, ops)
    inf = math.inf  # a kernel's first launch in the profile
    # a: itself, b and c since it began (666 B); c, b: c and a (6600 B), b, c and a (6660 B), the farthest
    assert found == [inf, inf, inf, 666.0, 6660.0, inf]


def test_a_call_with_a_kernel_new_to_the_profile_or_none_has_no_byte_distance() -> None:
    found = code_reuse_bytes([["a"], ["a", "e"], []], [_op(1), _op(1), _op(1)])
    assert found == [math.inf, math.inf, math.inf]


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


def _profiled_steps(before_repeat: object) -> list[tuple[str, list[list[int]]]]:
    assert callable(before_repeat)
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        before_repeat()
    return [(event.name, event.input_shapes) for event in prof.function_events]


def test_code_in_the_last_level_cache_is_fetched_after_the_data_eviction_and_before_the_code_eviction() -> None:
    """The step before each repeat: evict the data, run the kernel on other inputs (its code
    comes back into the last-level cache), evict the instruction caches, rewrite the inputs."""
    buffer_words = [2 * 4096 // 4]  # the eviction reads twice the cache as 32-bit words
    steps = _profiled_steps(_before_repeat_of(_row("30", "100"), "produced"))
    code_shape = list(SmallCacheCpu.code_eviction_shape)
    eviction = next(i for i, (_, shapes) in enumerate(steps) if shapes[:1] == [buffer_words])
    fetch = next(i for i, (name, shapes) in enumerate(steps) if name == "aten::mul" and shapes[:1] == [[1, 8, 1, 128]])
    on_code_shape = [i for i, (_, shapes) in enumerate(steps) if shapes[:1] == [code_shape]]
    assert eviction < fetch < min(on_code_shape) and len(on_code_shape) >= 42
    # evicted to memory: no call of the kernel, the code eviction first
    steps = _profiled_steps(_before_repeat_of(_row("30", "4000"), "produced"))
    assert not any(name == "aten::mul" for name, _ in steps)
    assert min(i for i, (_, shapes) in enumerate(steps) if shapes[:1] == [code_shape]) < min(
        i for i, (_, shapes) in enumerate(steps) if shapes[:1] == [buffer_words])


class _StepsJudge:
    """A candidate judge that keeps the step before each repeat made for a candidate of its own."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.case_args: tuple[object, ...] = ()
        self.step: object = None

    def candidate(self, *args: object) -> object:
        self.calls.append(args)
        return None

    def judge(self, case: object, replay: object, args: tuple[object, ...], timed_call: object,
              before_repeat_for: Callable[[Callable[..., object]], object]) -> None:
        self.case_args, self.step = args, before_repeat_for(self.candidate)


def test_a_candidate_has_its_own_code_fetched_where_the_rows_is() -> None:
    judge = _StepsJudge()
    runner = ReplayRunner(SmallCacheCpu(4096), collector=RecordingCollector(), repeat_count=2,  # type: ignore[arg-type]
                          warmup_count=0, cache_mode="produced", candidate_judge=judge)  # type: ignore[arg-type]
    row = _row("30", "100")
    runner.run(Case(CaseRef("rope", "Mul", "Mul.csv", 4, "Mul"), STATUS_READY, row=row, profiled_us=2.0))
    steps = _profiled_steps(judge.step)
    assert len(judge.calls) == 1  # the candidate, on inputs of the row's shapes but not the case's own
    (fetched,) = judge.calls
    assert [tuple(t.shape) for t in fetched] == [(1, 8, 1, 128), (1, 1, 1, 128)]  # type: ignore[attr-defined]
    assert all(t is not u for t, u in zip(fetched, judge.case_args))
    assert not any(name == "aten::mul" for name, _ in steps)  # not the row's kernel


def test_a_bad_code_reuse_cell_fails_the_case_naming_file_row_and_column() -> None:
    with pytest.raises(CaseFailure) as failure:
        _before_repeat_of(_row("often"), "produced")
    assert all(part in str(failure.value) for part in ("Mul.csv", "4", CODE_REUSE_COLUMN, "'often'"))


def test_a_bad_cell_read_directly_is_a_database_error_naming_the_column() -> None:
    with pytest.raises(DatabaseError) as error:
        code_cache_state(_row("often"), 4096)
    assert error.value.column == CODE_REUSE_COLUMN
    with pytest.raises(DatabaseError) as error:
        code_cache_state(_row("30", "far"), 4096)
    assert error.value.column == PROFILING_CODE_REUSE


def test_a_bad_code_reuse_cell_fails_no_case_timed_warm() -> None:
    assert _before_repeat_of(_row("often"), "warm") is None
