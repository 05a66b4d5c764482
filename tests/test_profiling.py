"""Attribution of profiler events to cases and repeats, and the CPU collector on a real profiler."""

from __future__ import annotations

import pytest

from perf_plugin.backends.cpu import CpuBackend
from perf_plugin.cases import STATUS_READY, Case
from perf_plugin.profiling.attribution import RawEvent, attribute_by_markers, attribute_cpu_ops
from perf_plugin.profiling.torch_profiler import TorchProfilerCollector


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
    timings, error = attribute_by_markers(list(reversed(events)), [(1, 0), (1, 1), None, (2, 0)])
    assert error is None
    assert timings[(1, 0)].total_ns == 5300
    assert timings[(1, 0)].kernels == {"gemm": (5000, 1), "Memset (Device)": (300, 1)}
    assert timings[(1, 1)].total_ns == 5200
    assert timings[(2, 0)].total_ns == 700
    assert sum(t.total_ns for t in timings.values()) == 5300 + 5200 + 700


def test_lost_markers_are_reported() -> None:
    events = [device("spin_kernel", 1, 1000), device("gemm", 2, 5000)]
    _, error = attribute_by_markers(events, [(1, 0), None])
    assert error is not None and "1 marker kernels for 2 launched" in error


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
    timings = attribute_cpu_ops(events)
    assert timings[(1, 0)].total_ns == 70
    assert timings[(1, 0)].kernels == {"aten::mm": (50, 1), "aten::add": (20, 1)}
    assert timings[(1, 1)].total_ns == 60


def test_cpu_collector_measures_real_profiled_ops_in_batches() -> None:
    import torch

    collector = TorchProfilerCollector(CpuBackend(), batch_size=2)
    a, b = torch.rand(64, 64), torch.rand(64, 64)
    drained = []
    for number in range(3):
        case = Case(f"case{number}", "MatMulV2", "MatMulV2.csv", number + 2, "sig", STATUS_READY)
        collector.measure(case, lambda: torch.mm(a, b), repeats=4)
        drained.append([r.case_id for r in collector.drain()])
    assert drained == [[], ["case0", "case1"], []]
    last = collector.finish()
    assert [r.case_id for r in last] == ["case2"]
    result = last[0]
    assert result.outcome == "passed" and len(result.samples_us) == 4
    assert all(s > 0 for s in result.samples_us)
    assert [k.name for k in result.kernels] == ["aten::mm"]
    assert result.kernels[0].calls_per_repeat == pytest.approx(1.0)


def test_case_result_json_round_trip() -> None:
    from perf_plugin.results import CaseResult, KernelTime

    result = CaseResult(
        "MatMulV2-1x2", "MatMulV2", "MatMulV2.csv", 3, "sig", "passed", backend="cuda",
        samples_us=(1.5, 2.5), kernels=(KernelTime("gemm", 2.0, 1.0),), reported_kernel_type="MatMulV3",
        counters={"aicore_time(us)": 1.25}, identity={"Input Shapes": '"1,2;2,3"'},
    )
    assert CaseResult.from_json(result.to_json()) == result
