"""GEMM references on the device: the decision, the opt-in, the fallbacks and the memory accounting.

A replay that sets ``reference_on_device`` computes its float64 reference where its inputs are
when that device has float64 GEMMs (CUDA); the CPU and NPUs keep the host reference.  No GPU
here: the device path's plumbing is checked on ``meta`` tensors (declared a float64 device for
the test), and the runner's accounting with a backend that says it is CUDA.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from perf_plugin.replay import base
from perf_plugin.replay.base import compute_reference, host_reference, reference_on_device
from perf_plugin.replay.kernels.matmul import MatMulReplay
from perf_plugin.replay.registry import get_replay
from perf_plugin.replay.tensors import KernelRow, kernel_row_from_cells
from perf_plugin.replay.verify import VerificationError, compare_bytes, compare_device, relative_error, verify_outputs
from perf_plugin.run.runner import MEMORY_HEADROOM, CaseSkip, ReplayRunner
from tests.kernels.support import kernel_row, replay_on_cpu

GEMMS = ("MatMulV2", "MatMulV3", "MatMulCommon", "BatchMatMulV2", "aten._scaled_mm")
SCALED_MM = {
    "Input Shapes": "64,128;128,32;;", "Input Data Types": "FLOAT8_E4M3FN;FLOAT8_E4M3FN;FLOAT;FLOAT",
    "Output Shapes": "64,32", "Output Data Types": "DT_BF16", "Input Strides": "128,1;1,128;;",
    "Op Arguments": '{"overload":"default","args":[{"tensor":0},{"tensor":1},{"tensor":2},{"tensor":3},null,null,15,false]}',
}


@pytest.mark.parametrize(
    ("opted_in", "device_type", "fits", "expected"),
    [
        (True, "cuda", True, True),
        (True, "cuda", False, False),  # the float64 copies would not fit: the host
        (True, "cpu", True, False),  # the inputs are on the host already
        (True, "npu", True, False),  # no float64 matmul on an NPU
        (True, "meta", True, False),
        (False, "cuda", True, False),  # element-wise references stay on the host
    ],
)
def test_the_decision(opted_in: bool, device_type: str, fits: bool, expected: bool) -> None:
    assert reference_on_device(opted_in, device_type, fits) is expected


def test_the_gemm_replays_opt_in_and_the_others_do_not() -> None:
    for kernel_type in GEMMS:
        replay = get_replay(kernel_type)
        assert replay is not None and replay.reference_on_device, kernel_type
    for kernel_type in ("Add", "RmsNorm", "SoftmaxV2", "aten.silu"):  # cheap on the host
        replay = get_replay(kernel_type)
        assert replay is not None and not replay.reference_on_device, kernel_type


@pytest.fixture
def meta_is_a_float64_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stands in for CUDA on a machine without one: meta tensors take the device path."""
    monkeypatch.setattr(base, "FLOAT64_DEVICE_TYPES", frozenset({"cuda", "meta"}))


def _matmul_args(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.rand(64, 32, device=device, dtype=torch.bfloat16)
    b = torch.rand(16, 32, device=device, dtype=torch.bfloat16).t()  # a linear layer's weight
    return a, b


def test_on_the_cpu_the_reference_is_the_float64_host_product_as_before() -> None:
    a, b = _matmul_args("cpu")
    reference = MatMulReplay().reference(a, b)
    assert reference.device.type == "cpu" and reference.dtype == torch.float64
    assert torch.equal(reference, a.double().mm(b.double()))


def test_on_a_float64_device_the_reference_stays_there(meta_is_a_float64_device: None) -> None:
    a, b = _matmul_args("meta")
    replay = MatMulReplay()
    reference = replay.reference(a, b)
    assert reference.device.type == "meta" and reference.dtype == torch.float64 and reference.shape == (64, 16)
    with host_reference():
        assert replay.reference_device((a, b)).type == "cpu"
    with host_reference(False):
        assert replay.reference_device((a, b)).type == "meta"
    # the aten.* replays pass their tensors in a tuple
    assert replay.reference_device(("mm", "default", [], (a, b), a.device)).type == "meta"
    # a replay that does not opt in keeps the host
    assert get_replay("Add").reference_device((a, b)).type == "cpu"  # type: ignore[union-attr]


def test_scaled_mm_reference_on_the_device_and_unchanged_on_the_cpu(meta_is_a_float64_device: None) -> None:
    replay = get_replay("aten._scaled_mm")
    assert replay is not None
    row = kernel_row("aten._scaled_mm", SCALED_MM)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    _, _, _, (a, b, scale_a, scale_b), _ = args
    expected = (a.double() @ b.double()) * scale_a.double() * scale_b.double()  # the former formula
    reference = replay.reference(*args)
    assert reference.device.type == "cpu" and torch.equal(reference, expected)
    meta = replay.make_inputs(row, torch.device("meta"), None)  # type: ignore[arg-type]
    on_device = replay.reference(*meta)
    assert on_device.device.type == "meta" and on_device.dtype == torch.float64 and on_device.shape == (64, 32)
    replay_on_cpu("aten._scaled_mm", SCALED_MM)  # and verifies


class _OutOfDeviceMemory(MatMulReplay):
    """A GEMM replay whose reference runs out of memory on the device, and says where it ran."""

    def __init__(self, message: str = "CUDA out of memory. Tried to allocate 1.50 GiB") -> None:
        self.message = message
        self.places: list[str] = []

    def reference(self, *args: Any) -> Any:
        where = self.reference_device(args).type
        self.places.append(where)
        if where == "meta" or self.message.startswith("host"):
            raise torch.OutOfMemoryError(self.message) if "memory" in self.message else RuntimeError(self.message)
        return "host reference"


def test_a_device_reference_out_of_memory_is_computed_on_the_host(meta_is_a_float64_device: None) -> None:
    args = _matmul_args("meta")
    replay = _OutOfDeviceMemory()
    assert compute_reference(replay, args) == "host reference"
    assert replay.places == ["meta", "cpu"]
    # other errors, and running out of host memory, are the case's own
    for message in ("shapes cannot be multiplied", "host: out of memory"):
        failing = _OutOfDeviceMemory(message)
        with pytest.raises(RuntimeError, match=message):
            compute_reference(failing, args if message.startswith("shapes") else _matmul_args("cpu"))
        assert len(failing.places) == 1


class _Backend:
    name = "cuda"

    def __init__(self, free: int, device_type: str = "cuda") -> None:
        self.free = free
        self.device = torch.device(device_type)  # a CUDA device object needs no GPU

    def free_memory_bytes(self) -> int:
        return self.free

    def torch_device(self) -> torch.device:
        return self.device


def _gemm_row(m: int, n: int, k: int) -> KernelRow:
    return kernel_row_from_cells("MatMulV2", {
        "Input Shapes": f"{m},{k};{n},{k}", "Input Data Types": "DT_BF16;DT_BF16",
        "Output Shapes": f"{m},{n}", "Output Data Types": "DT_BF16",
    })


def _case(row: KernelRow, kernel_type: str = "MatMulV2") -> Any:
    ref = SimpleNamespace(kernel_type=kernel_type, csv_file=Path(f"{kernel_type}.csv"), row_line=3)
    return SimpleNamespace(row=row, ref=ref, replay_kernel_type="", group_size=1)


def test_the_runner_counts_the_float64_reference_and_falls_back_to_the_host() -> None:
    row = _gemm_row(8192, 8192, 8192)
    need = int(row.nbytes * MEMORY_HEADROOM)  # 1.125 GiB
    reference = 8 * 3 * 8192 * 8192 + compare_bytes(8192 * 8192)  # 1.5 GiB of float64 + the comparison's chunks
    replay = MatMulReplay()
    backend = _Backend(free=80 * 2**30)
    runner = ReplayRunner(backend, collector=None, repeat_count=1, warmup_count=0)  # type: ignore[arg-type]
    assert runner._reference_bytes(row, replay) == reference
    assert runner._check_memory(_case(row), replay) is True
    backend.free = need + reference - 1  # the case fits, its reference beside it does not
    assert runner._check_memory(_case(row), replay) is True  # under 5% of the 80 GiB seen: not asked again
    runner._free_seen = None
    assert runner._check_memory(_case(row), replay) is False
    backend.free = need + reference
    assert runner._check_memory(_case(row), replay) is True
    backend.free = need - 1
    with pytest.raises(CaseSkip, match="tensors need about"):
        runner._check_memory(_case(row), replay)
    # a host reference takes no device memory: a replay that does not opt in, or a CPU backend
    add = get_replay("Add")
    assert runner._reference_bytes(row, add) == 0
    assert runner._reference_bytes(row, None) == 0
    cpu = ReplayRunner(_Backend(free=0, device_type="cpu"), collector=None, repeat_count=1, warmup_count=0)  # type: ignore[arg-type]
    assert cpu._reference_bytes(row, replay) == 0


def test_the_runner_replays_under_the_host_fallback_when_the_reference_does_not_fit(
    meta_is_a_float64_device: None,
) -> None:
    row = _gemm_row(4096, 4096, 4096)
    need = int(row.nbytes * MEMORY_HEADROOM)
    backend = _Backend(free=need)  # the tensors fit, nothing beside them
    runner = ReplayRunner(backend, collector=None, repeat_count=1, warmup_count=0)  # type: ignore[arg-type]
    places: list[str] = []
    probe = (torch.empty(2, device="meta"),)
    runner._run = lambda case, replay, seed: places.append(replay.reference_device(probe).type)  # type: ignore[method-assign]
    runner.run(_case(row))
    backend.free = 80 * 2**30
    runner._free_seen = None
    runner.run(_case(row))
    assert places == ["cpu", "meta"]


def test_the_comparison_runs_where_the_reference_is(monkeypatch: pytest.MonkeyPatch) -> None:
    assert compare_device(torch.zeros(2, dtype=torch.float64)).type == "cpu"
    # an NPU's own tensors (no float64 there) are compared on the host, as before
    assert compare_device(torch.zeros(2, dtype=torch.float64, device="meta")).type == "cpu"
    monkeypatch.setattr(base, "FLOAT64_DEVICE_TYPES", frozenset({"cuda", "meta"}))
    assert compare_device(torch.zeros(2, dtype=torch.float64, device="meta")).type == "meta"
    out = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert relative_error(out, torch.tensor([1.0, 2.0], dtype=torch.float64)) == 0.0
    assert compare_bytes(10) == 320 and compare_bytes(1 << 30) == compare_bytes(1 << 22)


# ----------------------------------------------------------------------------- on a CUDA device
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _gemm_cells(kernel_type: str, size: int) -> dict[str, str]:
    if kernel_type == "aten._scaled_mm":
        return {**SCALED_MM, "Input Shapes": f"{size},{size};{size},{size};;", "Output Shapes": f"{size},{size}",
                "Input Strides": f"{size},1;1,{size};;"}
    if kernel_type == "BatchMatMulV2":
        return {"Input Shapes": f"16,{size},128;16,128,512", "Input Data Types": "DT_BF16;DT_BF16",
                "Output Shapes": f"16,{size},512", "Output Data Types": "DT_BF16"}
    return {"Input Shapes": f"{size},{size};{size},{size}", "Input Data Types": "DT_BF16;DT_BF16",
            "Output Shapes": f"{size},{size}", "Output Data Types": "DT_BF16"}


@cuda
@pytest.mark.parametrize("kernel_type", GEMMS)
def test_on_cuda_the_reference_is_computed_and_compared_there(kernel_type: str) -> None:
    replay = get_replay(kernel_type)
    assert replay is not None
    row = kernel_row(kernel_type, _gemm_cells(kernel_type, 2048))
    device = torch.device("cuda")
    args = replay.make_inputs(row, device, torch.Generator(device).manual_seed(0))
    outputs = replay.run(*args)
    reference = compute_reference(replay, args)
    assert reference.device.type == "cuda" and reference.dtype == torch.float64
    assert compare_device(reference).type == "cuda"
    verify_outputs(replay, row, outputs, reference, args)
    with host_reference():
        host = compute_reference(replay, args)
    assert host.device.type == "cpu"
    verify_outputs(replay, row, outputs, host, args)
    assert float((reference.cpu() - host).norm() / host.norm()) < 1e-12  # the same float64 product
    assert relative_error(outputs, reference) == pytest.approx(relative_error(outputs, host), rel=1e-9)


@cuda
def test_on_cuda_a_wrong_output_still_fails() -> None:
    replay = get_replay("MatMulV2")
    assert replay is not None
    row = kernel_row("MatMulV2", _gemm_cells("MatMulV2", 1024))
    device = torch.device("cuda")
    args = replay.make_inputs(row, device, torch.Generator(device).manual_seed(0))
    outputs = replay.run(*args)
    outputs[7, 3] = float("nan")
    with pytest.raises(VerificationError, match="relative error inf"):
        verify_outputs(replay, row, outputs, compute_reference(replay, args), args)
    outputs = replay.run(*args) * 1.1
    with pytest.raises(VerificationError, match="exceeds the threshold"):
        verify_outputs(replay, row, outputs, compute_reference(replay, args), args)
