"""The CPU backend: always available; durations are the profiled CPU time of the op itself."""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING

from perf_plugin.backends.base import Backend

if TYPE_CHECKING:
    import torch


class CpuBackend(Backend):
    name = "cpu"
    ccl = "gloo"

    def torch_device(self) -> "torch.device":
        import torch

        return torch.device("cpu")

    def device_name(self) -> str:
        machine = (platform.machine() or "unknown").upper().replace("AMD64", "X86_64")
        return f"CPU_{machine}"

    def accelerator_version(self) -> tuple[str, str] | None:
        return None

    def free_memory_bytes(self) -> int | None:
        try:
            with open("/proc/meminfo", encoding="ascii") as handle:
                for line in handle:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None
