"""The CPU backend: always available; durations are the profiled CPU time of the op itself."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import TYPE_CHECKING

from perf_plugin.backends.base import Backend

if TYPE_CHECKING:
    import torch


class CpuBackend(Backend):
    name = "cpu"
    ccl = "gloo"
    collection_toggles = True
    # A core's instruction cache is tens of KB: small tensors evict it, and cost milliseconds less
    code_eviction_shape = (61, 67)

    @classmethod
    def device_string(cls, index: int) -> str:
        return "cpu"  # one device: xdist workers and ranks share it

    def torch_device(self) -> "torch.device":
        import torch

        return torch.device("cpu")

    def device_name(self) -> str:
        machine = (platform.machine() or "unknown").upper().replace("AMD64", "X86_64")
        return f"CPU_{machine}"

    def accelerator_version(self) -> tuple[str, str] | None:
        return None

    @staticmethod
    def ccl_version() -> str | None:
        import torch

        return torch.__version__.split("+", 1)[0]  # gloo is built into torch

    def free_memory_bytes(self) -> int | None:
        try:
            with open("/proc/meminfo", encoding="ascii") as handle:
                for line in handle:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def cache_bytes(self) -> int | None:
        return last_level_cache_bytes(Path("/sys/devices/system/cpu/cpu0/cache"))


def last_level_cache_bytes(cache_dir: Path) -> int | None:
    """Size of the highest-level data cache Linux describes under ``cache_dir`` (``index*/``)."""
    best: tuple[int, int] | None = None
    for index in cache_dir.glob("index*"):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size_text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        size = _size_bytes(size_text)
        if size and (best is None or level > best[0]):
            best = (level, size)
    return best[1] if best else None


def _size_bytes(text: str) -> int | None:
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    number, unit = (text[:-1], text[-1].upper()) if text and text[-1].upper() in units else (text, "")
    try:
        return int(number) * units.get(unit, 1)
    except ValueError:
        return None
