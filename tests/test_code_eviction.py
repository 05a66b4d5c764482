"""The instruction-cache eviction run before the repeats of the produced, idle and cold modes."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from perf_plugin.backends.base import Backend
from perf_plugin.backends.cpu import CpuBackend
from perf_plugin.backends.cuda import CudaBackend
from perf_plugin.replay.code_eviction import code_eviction, in_order


class _Recorder(TorchDispatchMode):
    """Records (operator, dtype, shape) of every aten call's first tensor argument."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, torch.dtype, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append((str(func.overloadpacket), args[0].dtype, tuple(args[0].shape)))
        return func(*args, **(kwargs or {}))


def test_code_eviction_runs_forty_two_distinct_operators_on_its_shape_in_three_dtypes() -> None:
    evict = code_eviction(torch.device("cpu"), (7, 11))
    with _Recorder() as recorder:
        assert evict() is None
    assert {shape for _, _, shape in recorder.calls} == {(7, 11)}
    assert {dtype for _, dtype, _ in recorder.calls} == {torch.float32, torch.bfloat16, torch.float16}
    # ten functions, two reductions, a softmax and a scan, per dtype: each once
    assert len(set(recorder.calls)) == len(recorder.calls) == 42


def test_code_eviction_runs_the_same_kernels_every_repeat() -> None:
    evict = code_eviction(torch.device("cpu"), (7, 11))
    with _Recorder() as recorder:
        evict()
        evict()
    assert recorder.calls[:42] == recorder.calls[42:]  # the same kernels every repeat, on tensors built once


def test_in_order_runs_both_calls_in_order() -> None:
    calls: list[str] = []
    in_order(lambda: calls.append("code"), None, lambda: calls.append("data"))()
    assert calls == ["code", "data"]


def test_accelerators_occupy_every_compute_unit_and_the_cpu_stays_small() -> None:
    rows, columns = CudaBackend.code_eviction_shape
    assert CudaBackend.code_eviction_shape == Backend.code_eviction_shape
    assert rows * columns >= 1 << 20  # > 132 SMs x 2048 threads x 4 elements
    cpu_rows, cpu_columns = CpuBackend.code_eviction_shape
    assert cpu_rows * cpu_columns <= 1 << 12
