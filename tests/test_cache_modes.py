"""Cache modes of the timed repeats: warm, cold (flush before each repeat), rotating inputs, produced inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from perf_plugin.backends.cpu import CpuBackend, last_level_cache_bytes
from perf_plugin.replay.cache_modes import (
    COPY_ALIGNMENT,
    MAX_ROTATION_COPIES,
    clone_inputs,
    cache_mode_label,
    effective_cache_mode,
    input_storages,
    produce_inputs,
    replicate_inputs,
    rotating,
    rotation_copies,
    rotation_plan,
    row_cache_mode,
    tensor_bytes,
)
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import PROFILING_INPUT_REUSE, PROFILING_INPUT_REUSE_SPREAD
from perf_plugin.replay.cold_inputs import CacheSplit, cached_shares, cold_inputs, has_reuse_evidence
from perf_plugin.replay.tensors import KernelRow
from perf_plugin.results import CaseRef
from perf_plugin.run.cases import STATUS_READY, Case
from perf_plugin.run.runner import CaseFailure, ReplayRunner
from tests.test_plugin import BENCH_TEST, HEADER, _profiler_modules_loaded, write_csv  # noqa: F401 (autouse fixture)


class SmallCacheCpu(CpuBackend):
    """The CPU backend with a last-level cache of a given size, to keep buffers small."""

    def __init__(self, cache: int) -> None:
        super().__init__()
        self.cache = cache

    def cache_bytes(self) -> int | None:
        return self.cache


class RecordingCollector:
    """A collector that times nothing: it keeps each case's step before the repeats, by case id."""

    kind = "in-process"

    def __init__(self) -> None:
        self.before_repeat: dict[str, object] = {}

    def measure(self, ref: CaseRef, run_once: object, repeats: int, before_repeat: object = None) -> None:
        self.before_repeat[ref.case_id] = before_repeat


def test_tensor_bytes_counts_nested_tensors_only() -> None:
    args = (torch.ones(4, 8), [torch.ones(3, dtype=torch.bfloat16), torch.ones(2, dtype=torch.int64)], 2.5, "x")
    assert tensor_bytes(args) == 4 * 8 * 4 + 3 * 2 + 2 * 8


def test_clone_inputs_gives_fresh_storage_with_equal_values_and_strides() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    args = (base.t(), [base[1:], base[:, 2:4], base[:1].expand(3, 6)], 7)
    copy = clone_inputs(args)
    assert isinstance(copy, tuple) and isinstance(copy[1], list) and copy[2] == 7
    for original, cloned in [(args[0], copy[0]), *zip(args[1], copy[1])]:
        assert cloned.data_ptr() != original.data_ptr()
        assert torch.equal(cloned, original)
        assert (cloned.stride(), cloned.storage_offset()) == (original.stride(), original.storage_offset())
    copy[0].add_(1)  # the copies share nothing with the originals
    assert torch.equal(base, torch.arange(24, dtype=torch.float32).reshape(4, 6))


@pytest.mark.parametrize(
    ("input_bytes", "cache", "expected"),
    [(10, 100, 20), (30, 100, 7), (300, 100, 1), (1, 10**9, MAX_ROTATION_COPIES), (0, 100, 1)],
)
def test_rotation_copies_exceed_twice_the_cache_up_to_the_cap(input_bytes: int, cache: int, expected: int) -> None:
    assert rotation_copies(input_bytes, cache) == expected


def test_rotation_copies_honour_a_smaller_cap() -> None:
    assert rotation_copies(10, 100, max_copies=4) == 4
    assert rotation_copies(60, 100, max_copies=4) == 4
    assert rotation_copies(100, 100, max_copies=4) == 2


@pytest.mark.parametrize(
    ("setting", "backend", "expected"),
    [("auto", "cuda", "rotate"), ("auto", "cpu", "warm"), ("auto", "npu", "warm"), ("cold", "cpu", "cold"), ("warm", "cuda", "warm")],
)
def test_auto_resolves_per_backend_and_explicit_modes_win(setting: str, backend: str, expected: str) -> None:
    assert effective_cache_mode(setting, backend) == expected


def test_rotating_cycles_through_the_input_sets_in_order() -> None:
    seen: list[int] = []
    run_once = rotating(lambda value: seen.append(value), [(1,), (2,), (3,)])
    for _ in range(7):
        run_once()
    assert seen == [1, 2, 3, 1, 2, 3, 1]


def _runner(mode: str, cache: int, max_copies: int = MAX_ROTATION_COPIES, repeats: int = 3) -> ReplayRunner:
    return ReplayRunner(
        SmallCacheCpu(cache), collector=None, repeat_count=repeats, warmup_count=0, cache_mode=mode,  # type: ignore[arg-type]
        rotate_max_copies=max_copies,
    )


def _pointers_seen(runner: ReplayRunner, inputs: tuple, calls: int) -> list[int]:
    pointers: list[int] = []
    run_once = runner._timed_call(lambda a, *rest: pointers.append(a.data_ptr()), inputs, runner.cache_mode)
    for _ in range(calls):
        run_once()
    return pointers


@pytest.mark.parametrize(
    ("input_bytes", "cache", "calls", "cap", "expected"),
    [
        (2048, 4096, 35, 1024, (4, False)),  # a cycle of 4 sets, each reused after 3 others
        (2048, 4096, 3, 1024, (3, True)),  # each set used once: build 3, flush for the rest
        (1024, 4096, 35, 3, (1, False)),  # the capped cycle (3 KiB) fits in the cache: warm
        (9000, 4096, 35, 1024, (1, False)),  # one set is larger than twice the cache
    ],
)
def test_rotation_plan(input_bytes: int, cache: int, calls: int, cap: int, expected: tuple[int, bool]) -> None:
    assert rotation_plan(input_bytes, cache, calls, cap) == expected


def test_rotate_mode_cycles_through_distinct_copies() -> None:
    inputs = (torch.ones(16, 16), torch.ones(16, 16))  # 2 KiB; cache 4 KiB -> a cycle of 4 sets
    pointers = _pointers_seen(_runner("rotate", 4096, repeats=8), inputs, 8)
    assert len(set(pointers)) == 4
    assert pointers[:4] == pointers[4:]
    assert pointers[0] == inputs[0].data_ptr()  # the verified inputs are the first set
    assert all((p - pointers[1]) % COPY_ALIGNMENT == 0 for p in pointers[1:4])  # copies share one buffer


def test_rotate_mode_builds_a_set_per_call_and_flushes_once_when_the_cycle_is_longer() -> None:
    runner = _runner("rotate", 4096, repeats=3)
    pointers = _pointers_seen(runner, (torch.ones(16, 16), torch.ones(16, 16)), 3)
    assert len(set(pointers)) == 3
    assert runner._flush_buffer is not None and bool((runner._flush_buffer == 1).all())


def test_rotate_mode_keeps_inputs_whose_capped_cycle_fits_in_the_cache() -> None:
    inputs = (torch.ones(16, 16),)  # 1 KiB; three copies (3 KiB) stay cached in 4 KiB
    assert set(_pointers_seen(_runner("rotate", 4096, max_copies=3, repeats=6), inputs, 6)) == {inputs[0].data_ptr()}


def test_replicated_inputs_equal_the_originals_in_value_and_layout() -> None:
    x, y = torch.randn(3, 127), torch.randn(127, 3).t()
    parts = [torch.ones(2), torch.zeros(5)]
    sets = replicate_inputs((x, y, parts, 2.0), 4)
    assert sets[0] == (x, y, parts, 2.0)
    for a, b, listed, scalar in sets[1:]:
        assert torch.equal(a, x) and a.is_contiguous() and a.data_ptr() != x.data_ptr()
        assert torch.equal(b, y) and b.stride() == y.stride() and b.data_ptr() != y.data_ptr()
        assert [torch.equal(c, o) and c.data_ptr() != o.data_ptr() for c, o in zip(listed, parts)] == [True, True]
        assert scalar == 2.0
    sets[1][0].add_(1)  # storage of their own
    assert torch.equal(sets[2][0], x)


@pytest.mark.parametrize("mode", ["warm", "cold"])
def test_other_modes_time_the_same_inputs(mode: str) -> None:
    inputs = (torch.ones(16, 16),)
    pointers: list[int] = []
    run_once = _runner(mode, 4096)._timed_call(lambda a: pointers.append(a.data_ptr()), inputs, mode)
    for _ in range(3):
        run_once()
    assert set(pointers) == {inputs[0].data_ptr()}


def test_cold_mode_flushes_a_buffer_twice_the_cache_and_warm_mode_none() -> None:
    inputs = (torch.ones(4),)
    assert _runner("warm", 4096)._before_repeat(inputs, "warm") is None
    assert _runner("rotate", 4096)._before_repeat(inputs, "rotate") is None
    runner = _runner("cold", 4096)
    flush = runner._before_repeat(inputs, "cold")
    assert flush is not None
    flush()
    assert runner._flush_buffer.numel() == 8192
    assert bool((runner._flush_buffer == 1).all())
    assert runner._before_repeat(inputs, "cold") is not None and runner._flush_buffer.numel() == 8192  # built once
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        flush()
    assert _code_evicted_before(prof.function_events, [8192])


def _code_evicted_before(events: list, buffer_shape: list[int]) -> bool:
    """Whether the operators ``events`` recorded ran the code eviction's distinct operators (on its
    shape) and only then touched the runner's buffer (of ``buffer_shape``)."""
    shape = list(CpuBackend.code_eviction_shape)
    on_shape = [i for i, e in enumerate(events) if e.input_shapes[:1] == [shape]]
    on_buffer = [i for i, e in enumerate(events) if e.input_shapes[:1] == [buffer_shape]]
    distinct = {events[i].name for i in on_shape if events[i].cpu_parent is None}
    return len(distinct) >= 14 and bool(on_buffer) and max(on_shape) < min(on_buffer)


def test_produced_mode_flushes_then_rewrites_every_input_storage_once_keeping_values() -> None:
    base = torch.randn(6, 4)
    view = base.t()  # a strided view of the same storage: rewritten once, as a whole
    expanded = torch.arange(3.0).expand(5, 3)  # stride 0: an in-place op on the view itself would fail
    flags = torch.tensor([True, False, True])
    parts = [torch.randint(-5, 5, (7,), dtype=torch.int8)]
    inputs = (base, view, expanded, flags, parts, 2.5)
    before = [t.clone() for t in (base, expanded, flags, parts[0])]
    storages = input_storages(inputs)
    assert [s.numel() for s in storages] == [96, 12, 3, 7]
    calls: list[str] = []
    produce = produce_inputs(lambda: calls.append("flush"), storages)
    with torch.autograd.profiler.profile() as prof:
        produce()
    assert calls == ["flush"]
    assert [e.name for e in prof.function_events if e.name == "aten::mul_"] == ["aten::mul_"] * 4
    assert all(torch.equal(a, b) for a, b in zip(before, (base, expanded, flags, parts[0])))


def test_produced_mode_evicts_by_reading_the_runners_buffer_then_rewrites() -> None:
    runner = _runner("produced", 4096)
    inputs = (torch.full((16, 16), 3.0),)
    produce = runner._before_repeat(inputs, "produced")
    assert produce is not None and runner._flush_buffer.numel() == 8192
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        produce()
    ops = [(e.name, e.input_shapes[0]) for e in prof.function_events if e.name in ("aten::amax", "aten::mul_")]
    code = [("aten::amax", list(CpuBackend.code_eviction_shape))] * 3  # the code eviction's reductions, one per dtype
    assert ops == [*code, ("aten::amax", [2048]), ("aten::mul_", [1024])]  # then 8192 bytes read as int32, the input's bytes
    assert bool((runner._flush_buffer == 0).all()) and bool((inputs[0] == 3.0).all())  # read, not written


def test_idle_mode_evicts_by_reading_and_launches_each_call_after_the_device_finished() -> None:
    events: list[str] = []

    class RecordingCpu(SmallCacheCpu):
        def synchronize(self) -> None:
            events.append("synchronize")

    runner = ReplayRunner(RecordingCpu(4096), collector=None, repeat_count=3, warmup_count=1, cache_mode="idle")  # type: ignore[arg-type]
    inputs = (torch.ones(16, 16),)
    evict = runner._before_repeat(inputs, "idle")
    assert evict is not None and runner._flush_buffer.numel() == 8192
    runner._flush_buffer.fill_(7)
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        evict()
    assert [e.name for e in prof.function_events if e.input_shapes[:1] == [[2048]]] == ["aten::amax"]  # read as int32
    assert _code_evicted_before(prof.function_events, [2048])
    assert bool((runner._flush_buffer == 7).all())
    run_once = runner._timed_call(lambda a: events.append(f"call {a.data_ptr()}"), inputs, "idle")
    run_once()
    run_once()
    assert events == ["synchronize", f"call {inputs[0].data_ptr()}"] * 2


def test_produced_mode_leaves_the_models_parameters_out_of_the_rewrite() -> None:
    runner = _runner("produced", 4096)
    x, weight, bias = torch.ones(4, 8), torch.ones(8, 16), torch.ones(16)
    produce = runner._before_repeat((x, weight, bias), "produced", CacheSplit(uncached=(weight.t().t(), bias)))
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        produce()
    assert [e.input_shapes[0] for e in prof.function_events if e.name == "aten::mul_"] == [[128]]  # x's bytes only


@pytest.mark.parametrize(
    ("profiled_us", "produced_from_us", "expected"),
    [(2.0, 2.0, "produced"), (37.0, 2.0, "produced"), (1.99, 2.0, "rotate"), (None, 2.0, "rotate"), (37.0, None, "rotate")],
)
def test_auto_replays_profiled_rows_of_longer_kernels_in_produced(
    profiled_us: float | None, produced_from_us: float | None, expected: str
) -> None:
    assert row_cache_mode("rotate", profiled_us, produced_from_us) == expected


def test_the_runner_picks_each_cases_mode_from_its_profile() -> None:
    """Two Add rows, profiled at 40 us and at 1 us, on a CPU backend told to choose as CUDA does:
    the first is timed with the produced rewrite before its repeats, the second without."""
    from perf_plugin.replay.tensors import kernel_row_from_cells

    recording = RecordingCollector()
    seen = recording.before_repeat
    runner = ReplayRunner(SmallCacheCpu(4096), collector=recording, repeat_count=2, warmup_count=0,  # type: ignore[arg-type]
                          cache_mode="rotate", produced_from_us=2.0)
    cells = {"Input Shapes": '"8,16;8,16"', "Input Data Types": "FLOAT;FLOAT", "Input Formats": "ND;ND",
             "Output Shapes": '"8,16"', "Output Data Types": "FLOAT", "Output Formats": "ND"}
    row = kernel_row_from_cells("Add", cells)
    for case_id, profiled in (("long", 40.0), ("short", 1.0)):
        runner.run(Case(CaseRef(case_id, "Add", "Add.csv", 2, "Add"), STATUS_READY, row=row, profiled_us=profiled))
    assert seen["long"] is not None and seen["short"] is None


def test_the_cuda_header_names_the_per_row_choice() -> None:
    assert cache_mode_label("auto", "cuda") == (
        "rotate (produced for rows profiled at 2 us or more or with their inputs' reuse distances)"
    )
    assert cache_mode_label("produced", "cuda") == "produced" and cache_mode_label("auto", "cpu") == "warm"


def test_gemm_replays_name_their_weights_as_parameters() -> None:
    from perf_plugin.replay.registry import get_replay
    from tests.kernels.support import kernel_row

    cells = {"Input Shapes": '"16,64;64,32;32"', "Input Data Types": "DT_BF16;DT_BF16;DT_BF16", "Input Formats": "ND;ND;ND",
             "Output Shapes": '"16,32"', "Output Data Types": "DT_BF16", "Output Formats": "ND"}
    replay = get_replay("MatMulV2")
    assert replay is not None
    row = kernel_row("MatMulV2", cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert [tuple(t.shape) for t in replay.parameters(row, args)] == [(64, 32), (32,)]
    assert get_replay("BatchMatMulV2").parameters(row, args) == ()  # type: ignore[union-attr]  # attention: activations


def _sysfs_cache(root: Path, entries: list[tuple[int, str, str]]) -> Path:
    for number, (level, kind, size) in enumerate(entries):
        index = root / f"index{number}"
        index.mkdir(parents=True)
        (index / "level").write_text(f"{level}\n")
        (index / "type").write_text(f"{kind}\n")
        (index / "size").write_text(f"{size}\n")
    return root


def test_last_level_cache_is_the_highest_data_level(tmp_path: Path) -> None:
    root = _sysfs_cache(tmp_path, [(1, "Data", "48K"), (1, "Instruction", "64K"), (2, "Unified", "2048K"), (3, "Unified", "32M")])
    assert last_level_cache_bytes(root) == 32 * 2**20
    assert last_level_cache_bytes(tmp_path / "absent") is None


def test_instruction_cache_never_counts(tmp_path: Path) -> None:
    root = _sysfs_cache(tmp_path, [(1, "Data", "32K"), (2, "Instruction", "1024K")])
    assert last_level_cache_bytes(root) == 32 * 1024


ROWS = ['dynamic,AI_VECTOR_CORE,"""8,128;8,128""",FLOAT;FLOAT,ND;ND,"""8,128""",FLOAT,ND']


@pytest.mark.parametrize("mode", ["rotate", "produced", "idle"])
def test_a_non_warm_mode_runs_and_is_reported(pytester: pytest.Pytester, mode: str) -> None:
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = write_csv(pytester.path / "db" / "Add.csv", HEADER, ROWS).parent
    result = pytester.runpytest("--database-path", str(db), "--repeat-count", "3", "--warmup-count", "1",
                                "-p", "no:cacheprovider", "--cache-mode", mode)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*3 repeats after 1 warm-up, {mode} cache*"])
    report = json.loads(next((db / "reports").glob("run_report_*.json")).read_text())
    assert report["replay_run"]["cache_mode"] == mode
    assert report["results"][0]["outcome"] == "passed"
    markdown = next((db / "reports").glob("replay_report_*.md")).read_text()
    assert f"| cache mode | {mode} |" in markdown


def test_auto_mode_is_warm_on_the_cpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = write_csv(pytester.path / "db" / "Add.csv", HEADER, ROWS).parent
    result = pytester.runpytest("--database-path", str(db), "--repeat-count", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*2 repeats after 5 warm-up, warm cache*"])
    report = json.loads(next((db / "reports").glob("run_report_*.json")).read_text())
    assert report["replay_run"]["cache_mode"] == "warm"
    assert report["replay_run"]["repeat_markers"] is False


def test_repeat_markers_setting_reaches_the_run_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = write_csv(pytester.path / "db" / "Add.csv", HEADER, ROWS).parent
    result = pytester.runpytest("--database-path", str(db), "--repeat-count", "2", "-p", "no:cacheprovider",
                                "--repeat-markers")
    result.assert_outcomes(passed=1)
    report = json.loads(next((db / "reports").glob("run_report_*.json")).read_text())
    assert report["replay_run"]["repeat_markers"] is True


def test_unknown_cache_mode_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = write_csv(pytester.path / "db" / "Add.csv", HEADER, ROWS).parent
    result = pytester.runpytest("--database-path", str(db), "-p", "no:cacheprovider", "--cache-mode", "hot")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--cache-mode: invalid choice: 'hot'*"])


def _row_with_reuse(cell: str) -> KernelRow:
    from perf_plugin.replay.tensors import kernel_row_from_cells

    cells = {"Input Shapes": '"4096;1,1,4096"', "Input Data Types": "DT_BF16;DT_BF16", "Input Formats": "ND;ND",
             "Output Shapes": '"1,1,4096"', "Output Data Types": "DT_BF16", "Output Formats": "ND",
             PROFILING_INPUT_REUSE: cell}
    return kernel_row_from_cells("Mul", cells)


@pytest.mark.parametrize(
    ("cell", "cold_shapes"),
    [("-;3000", [(4096,)]), ("5000;5000", []), ("7999;8000", [(1, 1, 4096)]), ("16384;-", [(4096,), (1, 1, 4096)]), ("", [])],
)
def test_cold_inputs_are_the_slots_written_0_8_of_a_cache_or_more_before(cell: str, cold_shapes: list[tuple[int, ...]]) -> None:
    row = _row_with_reuse(cell)
    weight, x = torch.ones(4096, dtype=torch.bfloat16), torch.ones(1, 1, 4096, dtype=torch.bfloat16)
    cold = cold_inputs(row, (weight, x), cache_bytes=10000)  # 0.8 of it is 8000 bytes
    assert [tuple(t.shape) for t in cold] == cold_shapes
    assert has_reuse_evidence(row) == bool(cell)


def test_cold_slots_of_one_shape_claim_distinct_tensors() -> None:
    from perf_plugin.replay.tensors import kernel_row_from_cells

    cells = {"Input Shapes": '"8;8"', "Input Data Types": "FLOAT;FLOAT", "Input Formats": "ND;ND",
             "Output Shapes": '"8"', "Output Data Types": "FLOAT", "Output Formats": "ND", PROFILING_INPUT_REUSE: "-;-"}
    a, b = torch.ones(8), torch.ones(8)
    cold = cold_inputs(kernel_row_from_cells("Add", cells), (a, b), cache_bytes=1)
    assert [t.data_ptr() for t in cold] == [a.data_ptr(), b.data_ptr()]


def test_slots_of_one_shape_claim_tensors_in_slot_order() -> None:
    """A cached first slot keeps the first tensor of the shape; the cold second slot is the second."""
    from perf_plugin.replay.tensors import kernel_row_from_cells

    cells = {"Input Shapes": '"8;8"', "Input Data Types": "FLOAT;FLOAT", "Input Formats": "ND;ND",
             "Output Shapes": '"8"', "Output Data Types": "FLOAT", "Output Formats": "ND", PROFILING_INPUT_REUSE: "10;-"}
    a, b = torch.ones(8), torch.ones(8)
    assert [t.data_ptr() for t in cold_inputs(kernel_row_from_cells("Add", cells), (a, b), cache_bytes=1000)] == [b.data_ptr()]


@pytest.mark.parametrize(
    ("distances", "spreads", "shares"),
    [
        ("8000;4000", "4000;0", (0.5, 1.0)),  # bytes 4000-12000 away, 8000 kept: half
        ("12000;100", "2000;100", (0.0, 1.0)),  # all of it beyond 8000; all within
        ("6000;-", "1000;-", (1.0, 0.0)),
        ("8000;7999", "", (0.0, 1.0)),  # an older row without spreads: by the distance alone
        ("8000;8000", "5", (0.0, 0.0)),  # a cell of another layout: likewise
    ],
)
def test_an_inputs_cached_share_is_the_part_of_its_range_within_the_cache(
    distances: str, spreads: str, shares: tuple[float, ...]
) -> None:
    row = _row_with_reuse(distances)
    row.attrs[PROFILING_INPUT_REUSE_SPREAD] = spreads
    assert cached_shares(row, cache_bytes=10000) == pytest.approx(shares)


def test_a_bad_spread_cell_names_its_column() -> None:
    row = _row_with_reuse("8000;8000")
    row.attrs[PROFILING_INPUT_REUSE_SPREAD] = "x;1"
    with pytest.raises(DatabaseError) as raised:
        cached_shares(row, cache_bytes=10000)
    assert PROFILING_INPUT_REUSE_SPREAD in str(raised.value)


def test_produced_mode_rewrites_the_tail_of_a_partly_cached_input() -> None:
    """The argmax over logits a GEMV of 1.5 waves wrote: a quarter of them cached (their tail,
    the last wave's), the rest left evicted; the model's parameters are not rewritten at all."""
    row = _row_with_reuse("8000;8000")
    row.attrs[PROFILING_INPUT_REUSE_SPREAD] = "2000;8000"  # weight: 6000-10000 away; x: 0-16000
    weight, x = torch.ones(4096, dtype=torch.bfloat16), torch.ones(1, 1, 4096, dtype=torch.bfloat16)
    split = CacheSplit.of(row, (weight, x), 10000, parameters=())
    assert split.uncached == () and [(tuple(t.shape), s) for t, s in split.partial] == [((4096,), 0.5), ((1, 1, 4096), 0.5)]
    runner = _runner("produced", 10000)
    produce = runner._before_repeat((weight, x), "produced", CacheSplit.of(row, (weight, x), 10000, parameters=(weight,)))
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        produce()
    assert [e.input_shapes[0] for e in prof.function_events if e.name == "aten::mul_"] == [[4096]]  # half x's 8192 bytes
    tail = CacheSplit(partial=((x, 0.5),)).rewritten((weight, x))
    assert [t.data_ptr() - x.data_ptr() for t in tail[1:]] == [4096]  # after the whole weight, x's last half


def test_a_bad_reuse_cell_fails_the_case_naming_file_row_and_column() -> None:
    recording = RecordingCollector()
    runner = ReplayRunner(SmallCacheCpu(4096), collector=recording, repeat_count=2, warmup_count=0,  # type: ignore[arg-type]
                          cache_mode="produced")
    case = Case(CaseRef("bad", "Mul", "Mul.csv", 7, "Mul"), STATUS_READY, row=_row_with_reuse("12;lots"), profiled_us=3.0)
    with pytest.raises(CaseFailure) as failure:
        runner.run(case)
    assert all(part in str(failure.value) for part in ("Mul.csv", "7", PROFILING_INPUT_REUSE, "'lots'"))
    assert recording.before_repeat == {}


def test_produced_mode_rewrites_only_the_inputs_the_profile_found_in_the_cache() -> None:
    """The norm weight's slot has no producer in the profile: the rewrite before each repeat
    leaves it evicted and rewrites the activation alone."""
    recording = RecordingCollector()
    seen = recording.before_repeat
    runner = ReplayRunner(SmallCacheCpu(1 << 20), collector=recording, repeat_count=2, warmup_count=0,  # type: ignore[arg-type]
                          cache_mode="rotate", produced_from_us=2.0)
    # profiled at 1 us, under the 2 us of auto's rule, but with evidence: produced
    runner.run(Case(CaseRef("norm", "Mul", "Mul.csv", 2, "Mul"), STATUS_READY, row=_row_with_reuse("-;8192"), profiled_us=1.0))
    produce = seen["norm"]
    assert callable(produce)
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        produce()
    assert [e.input_shapes[0] for e in prof.function_events if e.name == "aten::mul_"] == [[8192]]  # x's bytes only


@pytest.mark.parametrize(
    ("profiled_us", "evidence", "expected"), [(1.0, True, "produced"), (1.0, False, "rotate"), (None, True, "rotate")]
)
def test_auto_replays_rows_with_reuse_evidence_in_produced(profiled_us: float | None, evidence: bool, expected: str) -> None:
    assert row_cache_mode("rotate", profiled_us, 2.0, reuse_evidence=evidence) == expected
