"""How the timed repeats meet the device's caches: warm, cold, or rotating inputs.

* ``warm``: every repeat runs on the same inputs, which the previous repeat left in the cache.
* ``cold``: before every repeat, outside the timed range, a buffer larger than the last-level
  cache is overwritten, so each repeat reads its inputs from device memory.
* ``rotate``: the repeats cycle through enough copies of the inputs that together exceed twice
  the last-level cache, so a repeat's inputs were evicted since their previous use; outputs
  still come from the allocator's cache.  Copies are capped (``MAX_ROTATION_COPIES``): inputs
  so small that the capped cycle fits in the cache stay cached, as activations just written by
  the previous kernel do in a model (for those, ``cold`` is the mode that misses).
* ``produced``: before every repeat, outside the timed range, the cache is evicted (by reading a
  buffer twice its size, leaving clean lines as a model's weight reads do) and then the
  inputs are rewritten in place, as the kernel that produced them in a model leaves them: the
  inputs (as much of them as the cache holds) in the cache, everything else evicted, the timed
  kernel's own code, the model's parameters among its inputs and the inputs the row's profile
  shows were read from memory included.  Between the eviction and the rewrite, as many bytes
  are written as the row's profile shows the model had just written
  (``perf_plugin.replay.dirty_lines``): a prefill GEMM evicts the dirty lines the element-wise
  kernels before it left, and pays their write-back, as it did in the model.
* ``idle``: before every repeat, outside the timed range, the cache is evicted (read, as for
  ``produced``), and the repeat is launched only once the device has finished all earlier work, as a host-bound phase of a model
  (decode) launches its kernels: onto an idle device whose cache other kernels overwrote.

In ``cold``, ``produced`` and ``idle``, the step before every repeat begins with some forty
distinct kernels over the whole device, which evict the timed kernel's code from the instruction
caches as the kernels a model runs in between do (``perf_plugin.replay.code_eviction``: without
them, short kernels replayed up to a fifth faster than in the model).

Ingest records the launch context a PyTorch trace shows (``Profiling Average Launched Idle``: the
share of a row's launches that began on an idle device).  Choosing ``idle`` for rows launched
idle and ``produced`` for the others was measured on an H100 (``benchmarks/model_coverage.py``)
and landed fewer rows within 10 % of their in-model durations than one mode for all: eager model
runs launch almost every kernel onto an idle device, prefill included, so the share does not
tell the rows apart.

Only as many copies are built as there are calls (warm-up + repeats): when the cycle is longer,
each copy is used once, and one flush after building them stands in for the traffic of the
copies never built (``rotation_plan``).  So a cycle of 1024 copies costs 35 copies and a flush.

Which mode is closest to the durations the same kernels had inside a real model run is a
measurement (``benchmarks/model_coverage.py``); ``auto``, the default, follows it per backend
(``Backend.auto_cache_mode``) and, on CUDA, per row: a row whose profile says which of its inputs
the model found in the cache (``Profiling Input Reuse Distance(B)``, written by the ingest of a
trace with device activity) is replayed in ``produced`` with only those inputs rewritten
(``perf_plugin.replay.cold_inputs``); so is a row whose profile shows a kernel of at least 2 us;
others get ``rotate`` (``row_cache_mode``).  On an H100, over three decoder models, the per-input
rewrite put 86-96 % of the replayed kernel time within 10 % of its in-model duration (two
profiling runs), against 79-89 % for ``produced`` rewriting every input and 70-87 % for ``idle``
rewriting none: a decode-sized kernel runs ~0.3 us longer when any input comes from memory, and
which do differs from row to row.  ``produced`` costs ~0.3 ms per repeat (the eviction), so rows
without such evidence and with short kernels keep the cheap mode.  ``produced`` leaves a model's
parameters out of its rewrite (``OpReplay.parameters``: a linear layer's weight, an MoE layer's
experts): a model reads those from memory, and rewriting them made decode GEMMs of a Llama model
1.13-1.20x their in-model duration, where the other inputs in the cache and the weights out of it
landed 0.97-0.99x.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

CACHE_MODES = ("auto", "warm", "cold", "rotate", "produced", "idle")
DEFAULT_CACHE_MODE = "auto"
# What ``auto`` means per backend (``Backend.auto_cache_mode``).  CUDA: measured on an H100 against
# three decoder models profiled in a model run (README, "Coverage of real profiles").  The CPU and NPUs stay warm: on the CPU
# no mode was measured closer, and rotating copies of a last-level cache of hundreds of MB would
# cost memory and time; under msprof the other modes' extra kernels would be counted.
# Larger than any current accelerator's last-level cache (H100 50 MB, H200 60 MB, B200 126 MB,
# Ascend 910B 192 MB): the size of the cold-mode flush when the device does not report its own.
FALLBACK_CACHE_BYTES = 256 * 1024 * 1024
MAX_ROTATION_COPIES = 1024
COPY_ALIGNMENT = 512  # bytes: the CUDA caching allocator's block alignment


def effective_cache_mode(setting: str, backend_name: str) -> str:
    """The mode a run uses: ``setting`` itself, or for ``auto`` the backend's measured choice."""
    if setting != "auto":
        return setting
    from perf_plugin.backends.select import backend_class

    return backend_class(backend_name).auto_cache_mode


def cache_mode_label(setting: str, backend_name: str) -> str:
    """The run's mode as its header and report name it: the effective mode, and where ``auto``
    chooses per row, which rows get ``produced``."""
    mode = effective_cache_mode(setting, backend_name)
    if setting != "auto":
        return mode
    from perf_plugin.backends.select import backend_class

    produced_from = backend_class(backend_name).auto_produced_from_us
    if produced_from is None:
        return mode
    return f"{mode} (produced for rows profiled at {produced_from:g} us or more or with their inputs' reuse distances)"


def row_cache_mode(
    mode: str, profiled_us: float | None, produced_from_us: float | None, reuse_evidence: bool = False
) -> str:
    """``auto``'s mode for one row where the backend replays profiled rows in ``produced``: a row
    whose profile says which inputs were in the cache (``reuse_evidence``,
    ``perf_plugin.replay.cold_inputs``) or shows a kernel of at least ``produced_from_us``
    microseconds gets ``produced``, others (shorter kernels, rows never profiled) ``mode``."""
    if produced_from_us is None or profiled_us is None:
        return mode
    if reuse_evidence or profiled_us >= produced_from_us:
        return "produced"
    return mode


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


def rotation_keeps_inputs_cached(input_bytes: int, cache_bytes: int, max_copies: int = MAX_ROTATION_COPIES) -> bool:
    """Whether ``rotate`` finds inputs of this size in the cache at every call: they fit it, and
    its capped cycle of copies fits in twice the cache, so one set is built (``rotation_plan``)."""
    copies = rotation_copies(input_bytes, cache_bytes, max_copies)
    return copies > 1 and copies * input_bytes < 2 * cache_bytes


def rotation_plan(input_bytes: int, cache_bytes: int, calls: int, max_copies: int = MAX_ROTATION_COPIES) -> tuple[int, bool]:
    """(input sets to build, whether to flush the cache once after building them).

    One set when rotating cannot evict the inputs (the capped cycle fits in twice the cache:
    every call finds them cached, as in warm mode) or need not (one set is larger than that).
    """
    copies = rotation_copies(input_bytes, cache_bytes, max_copies)
    if copies == 1 or rotation_keeps_inputs_cached(input_bytes, cache_bytes, max_copies):
        return 1, False
    if calls < copies:
        return max(calls, 1), True
    return copies, False


def replicate_inputs(value: tuple[Any, ...], count: int) -> list[tuple[Any, ...]]:
    """``count`` input sets: ``value`` itself, then copies with storage of their own.

    A contiguous tensor is copied ``count - 1`` times by one kernel into one buffer and handed
    out as views, each starting on a ``COPY_ALIGNMENT`` boundary as the allocator's blocks do
    (a misaligned start could cost a kernel its vectorised loads); other layouts are copied one
    by one (``clone_inputs``).
    """
    if count <= 1:
        return [value]
    columns = [_copies_of(item, count - 1) for item in value]
    return [value] + [tuple(column[k] for column in columns) for k in range(count - 1)]


def _copies_of(value: Any, count: int) -> list[Any]:
    if not (hasattr(value, "untyped_storage") and value.dim() > 0 and value.is_contiguous()):
        return [clone_inputs(value) for _ in range(count)]
    import torch

    numel = value.numel()
    per_row = COPY_ALIGNMENT // value.element_size()
    stride = -(-numel // per_row) * per_row
    buffer = torch.empty((count, stride), dtype=value.dtype, device=value.device)
    rows = buffer[:, :numel]
    rows.copy_(value.reshape(1, numel).expand(count, numel))
    return [row.view(value.shape) for row in rows.unbind(0)]


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


def cache_evict(buffer: Any) -> Callable[[], Any]:
    """A no-argument call that reads ``buffer`` (evicting whatever the cache held, and leaving it
    full of clean lines, as a model's weight-reading kernels leave it).

    Overwriting instead leaves the cache full of dirty lines, whose write-back the next kernel
    pays: on an H100 that made decode GEMMs of a Llama model 1.21x their in-model duration,
    element-wise kernels of a few microseconds up to 1.5x.
    """
    import torch

    words = buffer.view(torch.int32)

    def evict() -> Any:
        return words.amax()

    return evict


def input_storages(value: Any, exclude: Any = ()) -> list[Any]:
    """Every distinct storage the tensors of ``value`` view, once each, as flat byte tensors,
    but those the tensors of ``exclude`` view.

    The whole storage, not the view: an expanded or strided input is rewritten without writing
    one element twice, and a storage two inputs share is rewritten once.
    """
    left_out = {(t.device, t.untyped_storage().data_ptr()) for t in tensors_in(exclude)}
    seen: dict[tuple[Any, int], Any] = {}
    for tensor in tensors_in(value):
        storage = tensor.untyped_storage()
        key = (tensor.device, storage.data_ptr())
        if key not in seen and key not in left_out and storage.nbytes():
            import torch

            seen[key] = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
    return list(seen.values())


def tensors_in(value: Any) -> list[Any]:
    """Every tensor in ``value`` (a tensor, or a tuple/list nesting tensors), in order."""
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in tensors_in(item)]
    return [value] if hasattr(value, "untyped_storage") and hasattr(value, "element_size") else []


# The unit a device's last-level cache fills from memory (32 bytes on NVIDIA GPUs).
SECTOR_BYTES = 32


def produce_inputs(flush: Callable[[], Any], storages: list[Any], written_evicted: Sequence[Any] = ()) -> Callable[[], Any]:
    """A no-argument call that flushes the cache, then rewrites every input storage in place, its
    values unchanged and its lines left in the cache as its producer's write left them.

    A storage is multiplied by one (a read, then a write), but one among ``written_evicted`` (its
    producer wrote it into lines out of the cache: ``cold_inputs.evicted_writes``) whose bytes end
    inside a sector (a norm's one-element statistic) is copied from a clone of it instead, a write
    that does not read it, as its producer's was: a sector partly written while out of the cache is
    partly valid, and a reader fetches the rest from memory.  On an H200 a one-float ``rsqrt`` took
    1.18-1.22 us after its input was written so (in a model, and after a read of twice the cache),
    0.99 us after a multiply in place or after a write-only copy of a whole sector."""
    evicted = {storage.data_ptr() for storage in written_evicted}
    write_only = [s.data_ptr() in evicted and s.numel() % SECTOR_BYTES != 0 for s in storages]
    multiplied = [storage for storage, only in zip(storages, write_only) if not only]
    copied = [(storage, storage.clone()) for storage, only in zip(storages, write_only) if only]

    def produce() -> None:
        flush()
        for storage in multiplied:
            storage.mul_(1)
        for storage, values in copied:
            storage.copy_(values)

    return produce
