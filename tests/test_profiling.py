"""Attribution of profiler events to cases and repeats, and the CPU collector on a real profiler."""

from __future__ import annotations

from typing import Any

import pytest

from perf_plugin.backends.cpu import CpuBackend
from perf_plugin.profiling.attribution import (
    CaseSpan,
    RawEvent,
    attribute_by_markers,
    attribute_cpu_ops,
    split_repeats,
)
from perf_plugin.backends.cuda import CudaBackend
from perf_plugin.profiling.torch_profiler import TorchProfilerCollector
from perf_plugin.results import CaseRef
from perf_plugin.run.cases import STATUS_READY, Case


def device(name: str, correlation: int, duration: int) -> RawEvent:
    return RawEvent(name, True, correlation * 100, duration, correlation, 0, False)


def test_markers_delimit_repeats_and_skip_untimed_work() -> None:
    events = [
        device("spin_kernel", 1, 1000),
        device("gemm", 2, 5000),
        device("Memset (Device)", 3, 300),
        device("spin_kernel", 4, 1000),
        device("gemm", 5, 5200),
        device("spin_kernel", 6, 1000),
        device("fill_kernel", 7, 9999),  # next case's input set-up: untimed
        device("spin_kernel", 8, 1000),
        device("add", 9, 700),
    ]
    # device events can arrive out of launch order; correlation ids restore it
    timings, error, case_errors = attribute_by_markers(list(reversed(events)), [(1, 0), (1, 1), None, (2, 0)])
    assert error is None and case_errors == {}
    assert timings[(1, 0)].total_ns == 5300
    assert timings[(1, 0)].kernels == {"gemm": (5000, 1), "Memset (Device)": (300, 1)}
    assert timings[(1, 1)].total_ns == 5200
    assert timings[(2, 0)].total_ns == 700
    assert sum(t.total_ns for t in timings.values()) == 5300 + 5200 + 700


def test_lost_markers_are_reported() -> None:
    events = [device("spin_kernel", 1, 1000), device("gemm", 2, 5000)]
    _, error, _ = attribute_by_markers(events, [(1, 0), None])
    assert error is not None and "1 marker kernels for 2 launched" in error


def test_one_case_that_launches_the_marker_kernel_itself_is_timed_with_it() -> None:
    # a session of one case (how candidates are timed): each repeat launched one marker kernel of its own
    events = [device("spin_kernel", 1, 1000), device("spin_kernel", 2, 90000), device("gemm", 3, 500),
              device("spin_kernel", 5, 91000), device("gemm", 6, 510), device("spin_kernel", 7, 1000)]
    timings, error, case_errors = attribute_by_markers(list(reversed(events)), [CaseSpan(1, 2), None])
    assert error is None and case_errors == {}
    assert [timings[(1, r)].total_ns for r in range(2)] == [90500, 91510]
    assert timings[(1, 0)].kernels == {"spin_kernel": (90000, 1), "gemm": (500, 1)}


def test_markers_of_the_work_are_told_apart_with_a_marker_per_repeat_and_untimed_work_between() -> None:
    # marker, work (its own marker last), marker, a cache flush (untimed), and again
    events = [device("spin_kernel", 1, 1000), device("gemm", 2, 500), device("spin_kernel", 3, 7000),
              device("spin_kernel", 4, 1000), device("flush", 5, 30000),
              device("spin_kernel", 6, 1000), device("gemm", 7, 520), device("spin_kernel", 8, 7100),
              device("spin_kernel", 9, 1000)]
    timings, error, _ = attribute_by_markers(events, [(1, 0), None, (1, 1), None])
    assert error is None
    assert [timings[(1, r)].total_ns for r in range(2)] == [7500, 7620]


def test_marker_kernels_launched_by_one_case_of_a_batch_of_several_are_named() -> None:
    events = [device("spin_kernel", 1, 1000), device("spin_kernel", 2, 90000), device("spin_kernel", 3, 1000),
              device("spin_kernel", 4, 1000), device("add", 5, 700), device("spin_kernel", 6, 1000)]
    _, error, _ = attribute_by_markers(events, [(1, 0), None, (2, 0), None])
    assert error is not None and "5 marker kernels for 4 launched: the timed work launched the marker kernel" in error


def test_marker_kernels_that_do_not_fit_the_repeats_are_named() -> None:
    events = [device("spin_kernel", 1, 1000), device("spin_kernel", 2, 90000), device("spin_kernel", 3, 1000),
              device("spin_kernel", 4, 1000)]
    _, error, _ = attribute_by_markers(events, [CaseSpan(1, 3), None])  # 2 extra markers over 3 repeats
    assert error is not None and "4 marker kernels for 2 launched" in error


def test_case_span_is_split_into_equal_runs_of_one_kernel_sequence() -> None:
    events = [
        device("fill_kernel", 1, 9999),  # input set-up before the first marker: untimed
        device("spin_kernel", 2, 1000),
        device("gemm", 3, 5000), device("Memset (Device)", 4, 300),
        device("gemm", 5, 5100), device("Memset (Device)", 6, 310),
        device("gemm", 7, 5200), device("Memset (Device)", 8, 320),
        device("spin_kernel", 9, 1000),
        device("copy_kernel", 10, 8888),  # the next case's set-up: untimed
        device("spin_kernel", 11, 1000),
        device("add", 12, 700), device("add", 13, 710),
        device("spin_kernel", 14, 1000),
    ]
    segments = [CaseSpan(1, 3), None, CaseSpan(2, 2), None]
    timings, error, case_errors = attribute_by_markers(list(reversed(events)), segments)
    assert error is None and case_errors == {}
    assert [timings[(1, r)].total_ns for r in range(3)] == [5300, 5410, 5520]
    assert timings[(1, 2)].kernels == {"gemm": (5200, 1), "Memset (Device)": (320, 1)}
    assert [timings[(2, r)].total_ns for r in range(2)] == [700, 710]
    assert set(timings) == {(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)}


def test_case_span_whose_kernels_vary_per_call_is_refused_not_guessed() -> None:
    events = [
        device("spin_kernel", 1, 1000),
        device("gemm", 2, 5000), device("reduce", 3, 300),  # call 1: two kernels
        device("gemm", 4, 5000), device("gemm", 5, 5000),  # calls 2 and 3: one kernel each
        device("spin_kernel", 6, 1000),
        device("spin_kernel", 7, 1000),
        device("add", 8, 700),
        device("spin_kernel", 9, 1000),
    ]
    timings, error, case_errors = attribute_by_markers(events, [CaseSpan(1, 3), None, CaseSpan(2, 1), None])
    assert error is None
    assert set(case_errors) == {1} and "4 device kernels over 3 repeats" in case_errors[1]
    assert "--perf-repeat-markers" in case_errors[1]
    assert not any(key[0] == 1 for key in timings)
    assert timings[(2, 0)].total_ns == 700


def test_split_repeats_rules() -> None:
    a, b = device("a", 1, 10), device("b", 2, 20)
    assert split_repeats([a, b, a, b], 2) == [[a, b], [a, b]]
    assert split_repeats([a, a, a], 3) == [[a], [a], [a]]
    assert split_repeats([a, b, b, a], 2) is None  # same count, different order
    assert split_repeats([a, b, a], 2) is None  # not divisible
    assert split_repeats([], 2) == [[], []]  # an op that launched nothing: empty repeats, not an error
    assert split_repeats([a], 0) is None


class _FakeCudaBackend(CudaBackend):
    """The CUDA backend's declarations, on a machine without a GPU."""

    def marker(self) -> Any:
        return lambda: None  # replaced by each test

    def synchronize(self) -> None:
        pass


@pytest.mark.parametrize(
    ("repeat_markers", "before_repeat", "expected_segments", "expected_markers"),
    [
        (False, False, [CaseSpan(1, 3), None], 2),
        (True, False, [(1, 0), (1, 1), (1, 2), None], 4),
        (False, True, [(1, 0), None, (1, 1), None, (1, 2), None], 6),  # cold flushes: per-repeat markers
    ],
)
def test_cuda_collector_marker_layout(
    monkeypatch: pytest.MonkeyPatch, repeat_markers: bool, before_repeat: bool, expected_segments: list, expected_markers: int
) -> None:
    collector = TorchProfilerCollector(_FakeCudaBackend(), repeat_markers=repeat_markers)  # type: ignore[arg-type]
    launched: list[str] = []
    monkeypatch.setattr(collector, "_ensure_started", lambda: None)
    monkeypatch.setattr(collector, "_marker", lambda: launched.append("marker"))
    case = Case(CaseRef("case0", "Add", "Add.csv", 2, "sig"), STATUS_READY)
    flush = (lambda: launched.append("flush")) if before_repeat else None
    collector.measure(case.ref, lambda: launched.append("run"), repeats=3, before_repeat=flush)
    assert collector._segments == expected_segments
    assert launched.count("marker") == expected_markers and launched.count("run") == 3
    if before_repeat:
        # every flush lies outside the timed segments: right before the marker that opens a repeat
        assert [i for i, x in enumerate(launched) if x == "flush"] == [0, 4, 8]


def test_toggled_collection_brackets_the_markers_and_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = TorchProfilerCollector(_FakeCudaBackend())  # type: ignore[arg-type]
    assert not collector._toggles  # CUDA keeps collection on unless asked (not shown to work there)
    launched: list[str] = []
    monkeypatch.setattr(collector, "_ensure_started", lambda: None)
    monkeypatch.setattr(collector, "_marker", lambda: launched.append("marker"))
    monkeypatch.setattr(collector, "_collect", lambda enable: launched.append("on" if enable else "off"))
    case = Case(CaseRef("case0", "Add", "Add.csv", 2, "sig"), STATUS_READY)

    def failing() -> None:
        launched.append("run")
        if launched.count("run") == 5:
            raise RuntimeError("replay broke")

    collector.measure(case.ref, lambda: launched.append("run"), repeats=3)
    assert launched == ["on", "marker", "run", "run", "run", "marker", "off"]
    with pytest.raises(RuntimeError):
        collector.measure(case.ref, failing, repeats=3)
    assert launched[-1] == "off"  # collection is switched off again when a replay raises


def cpu(name: str, start: int, duration: int, thread: int = 1) -> RawEvent:
    return RawEvent(name, False, start, duration, 0, thread, name.startswith("perfcase::"))


def test_cpu_ranges_count_top_level_ops_only() -> None:
    events = [
        cpu("perfcase::1::0", 100, 100),
        cpu("aten::mm", 110, 50),
        cpu("aten::resolve_conj", 115, 5),  # nested in aten::mm
        cpu("aten::add", 170, 20),
        cpu("perfcase::1::1", 300, 100),
        cpu("aten::mm", 310, 60),
        cpu("aten::mm", 500, 60),  # outside every range
        cpu("aten::mm", 320, 40, thread=2),  # another thread
    ]
    timings = attribute_cpu_ops(events).timings
    assert timings[(1, 0)].total_ns == 70
    assert timings[(1, 0)].kernels == {"aten::mm": (50, 1), "aten::add": (20, 1)}
    assert timings[(1, 1)].total_ns == 60


def test_cpu_collector_measures_real_profiled_ops_in_batches() -> None:
    import torch

    collector = TorchProfilerCollector(CpuBackend(), batch_size=2)
    a, b = torch.rand(64, 64), torch.rand(64, 64)
    drained = []
    for number in range(3):
        case = Case(CaseRef(f"case{number}", "MatMulV2", "MatMulV2.csv", number + 2, "sig"), STATUS_READY)
        collector.measure(case.ref, lambda: torch.mm(a, b), repeats=4)
        drained.append([r.ref.case_id for r in collector.drain()])
    assert drained == [[], ["case0", "case1"], []]
    last = collector.finish()
    assert [r.ref.case_id for r in last] == ["case2"]
    result = last[0]
    assert result.outcome == "passed" and len(result.samples_us) == 4
    assert all(s > 0 for s in result.samples_us)
    assert [k.name for k in result.kernels] == ["aten::mm"]
    assert result.kernels[0].calls_per_repeat == pytest.approx(1.0)


def test_an_interrupt_while_a_profiler_session_starts_leaves_the_collector_able_to_finish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C can land inside the profiler's start (seen on an H100 under torchrun): the session
    end must still flush the cases measured before, not fail on a session never started."""
    import torch
    from torch.profiler import profile

    collector = TorchProfilerCollector(CpuBackend(), batch_size=2)
    a = torch.rand(16, 16)
    measured = Case(CaseRef("case0", "MatMulV2", "MatMulV2.csv", 2, "sig"), STATUS_READY)
    collector.measure(measured.ref, lambda: torch.mm(a, a), repeats=2)
    collector.measure(measured.ref, lambda: torch.mm(a, a), repeats=2)
    first = collector.drain()  # the batch is stopped; the next case starts a session
    enter = profile.__enter__

    def interrupted_enter(self: Any) -> Any:
        raise KeyboardInterrupt  # before the session was initialized (torch imports lazily there)

    monkeypatch.setattr(profile, "__enter__", interrupted_enter)
    cut = Case(CaseRef("case1", "MatMulV2", "MatMulV2.csv", 3, "sig"), STATUS_READY)
    with pytest.raises(KeyboardInterrupt):
        collector.measure(cut.ref, lambda: torch.mm(a, a), repeats=2)
    monkeypatch.setattr(profile, "__enter__", enter)
    assert [(r.ref.case_id, r.outcome) for r in first] == [("case0", "passed")] * 2
    assert collector.finish() == []  # nothing measured since: the half-started session is gone
    with profile(activities=[torch.profiler.ProfilerActivity.CPU]):  # the process can profile again
        torch.mm(a, a)


def test_cpu_collector_records_only_the_timed_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    collector = TorchProfilerCollector(CpuBackend(), batch_size=8)
    stopped: list[list[RawEvent]] = []
    stop = collector._stop
    monkeypatch.setattr(collector, "_stop", lambda: stopped.append(stop()) or stopped[-1])
    for number in range(3):
        a, b = torch.rand(32, 32), torch.rand(32, 32)  # set-up between cases: must not be recorded
        torch.mm(a, b)  # a "verification" call outside the repeats
        case = Case(CaseRef(f"case{number}", "MatMulV2", "MatMulV2.csv", number + 2, "sig"), STATUS_READY)
        collector.measure(case.ref, lambda: torch.mm(a, b), repeats=5)
    results = collector.finish()
    assert [r.outcome for r in results] == ["passed"] * 3
    names = [event.name for event in stopped[0]]
    assert "aten::rand" not in names and "aten::uniform_" not in names
    assert names.count("aten::mm") == 3 * 5  # the repeats only, not the calls outside them
    assert sum(name.startswith("perfcase::") for name in names) == 3  # one range per case


def test_cpu_whole_case_range_is_split_into_equal_runs_of_top_level_ops() -> None:
    events = [cpu("perfcase::4::all", 100, 400)]
    for repeat in range(3):
        start = 110 + 100 * repeat
        events += [cpu("aten::mm", start, 50 + repeat), cpu("aten::resolve_conj", start + 5, 5), cpu("aten::add", start + 60, 20)]
    attribution = attribute_cpu_ops(events, {4: 3})
    assert attribution.case_errors == {}
    assert [attribution.timings[(4, r)].total_ns for r in range(3)] == [70, 71, 72]
    assert attribution.timings[(4, 2)].kernels == {"aten::mm": (52, 1), "aten::add": (20, 1)}


def test_cpu_whole_case_range_with_a_varying_op_sequence_is_a_case_error() -> None:
    events = [cpu("perfcase::2::all", 100, 400), cpu("aten::mm", 110, 50), cpu("aten::add", 170, 20), cpu("aten::mm", 210, 50)]
    attribution = attribute_cpu_ops(events, {2: 2})
    assert "not the same operator sequence per repeat" in attribution.case_errors[2]
    assert "--perf-repeat-markers" in attribution.case_errors[2]
    assert not attribution.timings


@pytest.mark.parametrize(("repeat_markers", "ranges_per_case"), [(False, 1), (True, 4)])
def test_cpu_collector_labels_the_case_or_every_repeat(repeat_markers: bool, ranges_per_case: int) -> None:
    import torch

    collector = TorchProfilerCollector(CpuBackend(), batch_size=8, repeat_markers=repeat_markers)
    stopped: list[list[RawEvent]] = []
    stop = collector._stop
    collector._stop = lambda: stopped.append(stop()) or stopped[-1]  # type: ignore[method-assign]
    a, b = torch.rand(16, 16), torch.rand(16, 16)
    for number in range(2):
        case = Case(CaseRef(f"case{number}", "MatMulV2", "MatMulV2.csv", number + 2, "sig"), STATUS_READY)
        collector.measure(case.ref, lambda: torch.mm(a, b), repeats=4)
    results = collector.finish()
    assert [len(r.samples_us) for r in results] == [4, 4]
    assert all(r.outcome == "passed" for r in results)
    ranges = [e.name for e in stopped[0] if e.name.startswith("perfcase::")]
    assert len(ranges) == 2 * ranges_per_case


def test_case_result_json_round_trip() -> None:
    from perf_plugin.results import CaseResult, KernelTime

    result = CaseResult(
        CaseRef("MatMulV2-1x2", "MatMulV2", "MatMulV2.csv", 3, "sig"), "passed", backend="cuda",
        samples_us=(1.5, 2.5), kernels=(KernelTime("gemm", 2.0, 1.0),), reported_kernel_type="MatMulV3",
        counters={"aicore_time(us)": 1.25}, identity={"Input Shapes": '"1,2;2,3"'},
    )
    assert CaseResult.from_json(result.to_json()) == result
