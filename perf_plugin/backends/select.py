"""Choose the backend: ``--perf-backend auto`` prefers an NPU, then CUDA, then the CPU."""

from __future__ import annotations

from perf_plugin.backends.base import Backend
from perf_plugin.backends.cpu import CpuBackend
from perf_plugin.backends.cuda import CudaBackend
from perf_plugin.backends.npu import NpuBackend

BACKEND_CLASSES: dict[str, type[Backend]] = {"cpu": CpuBackend, "cuda": CudaBackend, "npu": NpuBackend}
BACKEND_CHOICES = ("auto", *BACKEND_CLASSES)


def backend_class(name: str) -> type[Backend]:
    """The class of a resolved backend name (its declarations, without touching the device)."""
    return BACKEND_CLASSES[name]


def detect_backend_class() -> type[Backend]:
    """What ``--perf-backend auto`` picks on this host: an NPU, then CUDA, then the CPU."""
    if NpuBackend.available():
        return NpuBackend
    if CudaBackend.available():
        return CudaBackend
    return CpuBackend


def resolve_backend(choice: str, index: int = 0, ascend_device: str | None = None) -> Backend:
    if choice not in BACKEND_CHOICES:
        raise ValueError(f"unknown backend {choice!r} (choose from {', '.join(BACKEND_CHOICES)})")
    cls = detect_backend_class() if choice == "auto" else BACKEND_CLASSES[choice]
    if cls is CpuBackend:
        return CpuBackend(index)
    if cls is CudaBackend:
        if not CudaBackend.available():
            raise RuntimeError("--perf-backend cuda was asked for, but torch sees no CUDA device")
        return CudaBackend(index)
    backend = NpuBackend(index, ascend_device) if ascend_device else NpuBackend(index)
    if not NpuBackend.available():
        raise RuntimeError("--perf-backend npu was asked for, but torch_npu is missing or sees no NPU")
    return backend
