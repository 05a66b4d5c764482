"""The CUDA backend: kernels timed from CUPTI activity records through torch.profiler."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perf_plugin.backends.base import Backend
from perf_plugin.database.paths import sanitise_device_name

if TYPE_CHECKING:
    import torch


class CudaBackend(Backend):
    name = "cuda"
    ccl = "nccl"
    visible_devices_var = "CUDA_VISIBLE_DEVICES"
    # On an H100, of the replayed kernel time of three decoder models (Llama, Qwen3-MoE, Llama
    # with FP8 GEMMs) within 10 % of its in-model duration: this choice 86.2 / 84.8 / 82.3 %,
    # produced for every row 86.2 / 84.6 / 82.6 %, rotate 82.5 / 79.0 / 75.6 %
    # (benchmarks/model_coverage.py, README "Coverage of real profiles").
    auto_cache_mode = "rotate"
    auto_produced_from_us = 2.0
    profiler_activity = "CUDA"
    version_scheme = "torch+accelerator"
    environment_section = "cuda_devices"
    eager_ccl_init = True

    @staticmethod
    def available() -> bool:
        import torch

        return torch.cuda.is_available()

    @staticmethod
    def device_count() -> int:
        import torch

        return int(torch.cuda.device_count())

    def spin_kernel(self) -> Callable[[int], None] | None:
        import torch

        sleep: Callable[[int], None] | None = getattr(torch.cuda, "_sleep", None)  # private: absent from some builds
        return sleep

    def bind(self) -> "torch.device":
        import torch

        count = torch.cuda.device_count()
        if self.index >= count:
            raise RuntimeError(f"there is no CUDA device {self.index}: {count} visible")
        torch.cuda.set_device(self.index)
        return self.torch_device()

    def fp8_gemm(self) -> bool:
        import torch

        return torch.cuda.get_device_capability(self.torch_device()) >= (8, 9)  # Ada and Hopper on

    def timing_event(self) -> Any | None:
        import torch

        return torch.cuda.Event

    @staticmethod
    def ccl_version() -> str | None:
        import torch

        return ".".join(str(part) for part in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]

    def torch_device(self) -> "torch.device":
        import torch

        return torch.device("cuda", self.index)

    def device_name(self) -> str:
        import torch

        return sanitise_device_name(torch.cuda.get_device_name(self.index))

    def accelerator_version(self) -> tuple[str, str] | None:
        import torch

        return ("cuda", torch.version.cuda or "unknown")

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.index)

    def free_memory_bytes(self) -> int | None:
        import torch

        free, _total = torch.cuda.mem_get_info(self.index)
        return int(free)

    def empty_cache(self) -> None:
        import torch

        torch.cuda.empty_cache()

    def peak_memory_bytes(self) -> int | None:
        import torch

        return int(torch.cuda.max_memory_allocated(self.index))

    def cache_bytes(self) -> int | None:
        import torch

        size = getattr(torch.cuda.get_device_properties(self.index), "L2_cache_size", 0)
        return int(size) or None

    def compute_units(self) -> int | None:
        import torch

        return int(torch.cuda.get_device_properties(self.index).multi_processor_count) or None
