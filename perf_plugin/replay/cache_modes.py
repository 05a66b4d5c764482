"""How the timed repeats meet the device's caches: warm, cold, or rotating inputs.

* ``warm``: every repeat runs on the same inputs, which the previous repeat left in the cache.
* ``cold``: before every repeat, outside the timed range, a buffer larger than the last-level
  cache is overwritten, so each repeat reads its inputs from device memory.
* ``rotate``: the repeats cycle through enough copies of the inputs that together exceed twice
  the last-level cache, so a repeat's inputs were evicted since their previous use; outputs
  still come from the allocator's cache.  Copies are capped (``MAX_ROTATION_COPIES``), so inputs
  of a few KiB stay partly cached: for those, ``cold`` is the mode that misses.

Which mode is closest to the durations the same kernels had inside a real model run is a
measurement (``tests/perf/cache_modes_vs_model.py``); ``auto``, the default, follows it per
backend (``AUTO_CACHE_MODE``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

CACHE_MODES = ("auto", "warm", "cold", "rotate")
DEFAULT_CACHE_MODE = "auto"
# What ``auto`` means per backend.  CUDA: measured on an H100 against four Llama-3.1-8B decoder
# layers profiled in a model run (README, "Cache modes").  The CPU and NPUs stay warm: on the CPU
# no mode was measured closer, and rotating copies of a last-level cache of hundreds of MB would
# cost memory and time; under msprof the other modes' extra kernels would be counted.
AUTO_CACHE_MODE = {"cuda": "rotate"}
# Larger than any current accelerator's last-level cache (H100 50 MB, H200 60 MB, B200 126 MB,
# Ascend 910B 192 MB): the size of the cold-mode flush when the device does not report its own.
FALLBACK_CACHE_BYTES = 256 * 1024 * 1024
MAX_ROTATION_COPIES = 1024


def effective_cache_mode(setting: str, backend_name: str) -> str:
    """The mode a run uses: ``setting`` itself, or for ``auto`` the backend's measured choice."""
    if setting != "auto":
        return setting
    return AUTO_CACHE_MODE.get(backend_name, "warm")


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in ``value`` (a tensor, or a tuple/list nesting tensors)."""
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(item) for item in value)
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return int(value.numel() * value.element_size())
    return 0


def clone_inputs(value: Any) -> Any:
    """A copy of the inputs with fresh storage for every tensor.

    The storage is copied whole and viewed with the same offset, sizes and strides, so a
    non-contiguous or expanded input keeps the memory layout the kernel was timed with
    (``Tensor.clone`` makes non-dense tensors contiguous).
    """
    if isinstance(value, tuple):
        return tuple(clone_inputs(item) for item in value)
    if isinstance(value, list):
        return [clone_inputs(item) for item in value]
    if hasattr(value, "untyped_storage") and hasattr(value, "element_size"):
        import torch

        storage = value.untyped_storage().clone()
        copy = torch.empty(0, dtype=value.dtype, device=value.device)
        return copy.set_(storage, value.storage_offset(), value.size(), value.stride())
    return value


def rotation_copies(input_bytes: int, cache_bytes: int, max_copies: int = MAX_ROTATION_COPIES) -> int:
    """Input sets to cycle through so that together they exceed twice the cache (at most ``max_copies``)."""
    if input_bytes <= 0:
        return 1
    return max(1, min(max_copies, math.ceil(2 * cache_bytes / input_bytes)))


def rotating(function: Callable[..., Any], input_sets: list[tuple[Any, ...]]) -> Callable[[], Any]:
    """A no-argument call that runs ``function`` on the next input set each time."""
    sets = itertools.cycle(input_sets)

    def run_once() -> Any:
        return function(*next(sets))

    return run_once


def cache_flush(buffer: Any) -> Callable[[], Any]:
    """A no-argument call that overwrites ``buffer`` (evicting whatever the cache held)."""

    def flush() -> Any:
        return buffer.fill_(1)

    return flush
