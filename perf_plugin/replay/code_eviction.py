"""Evicting the device's instruction caches before a timed repeat, as a model run leaves them.

An eager model runs some hundred distinct kernels between two calls of one kernel, so each call
fetches its code (from the last-level cache or memory) into the compute units' instruction
caches.  A replay runs one kernel over and over: with only the data eviction and the input
rewrite between repeats, the kernel's code stays in those caches and the repeat skips the fetch.
The difference is not small for short kernels: on an H100, the Qwen3-MoE decode step's sum over
its 8 experts (``[1,8,2048]`` bf16) took 5.05 us in the model and 3.5-3.9 us replayed in
``produced``; with the distinct kernels below run before each repeat, 5.2-5.7 us.  Its prefill
counterpart went from 8.0-8.3 to 10.2 us (10.3 us in the model), an MoE ``mul`` from 2.02-2.24 to
2.30-2.45 us (2.45), a ``masked_fill`` from 2.05-2.40 to 2.35-2.66 us (2.66); prefill GEMMs moved
by 2-4 % (``reproduce/wip/code_cache_effect.py``, three runs).  The kernels' data is not what
moves them: run before the data eviction, so that it leaves no line of theirs dirty, the figures
are the same.

Not every kernel of a model finds its code evicted: rotary embedding runs its ``mul``, ``neg`` and
``cat`` for the queries and, a few kernels later, for the keys.  Ingest records how many distinct
kernels ran since a row's kernels last did (``Profiling Average Code Reuse Distance(kernels)``,
``perf_plugin.ingest.code_reuse``), and a row whose model ran at most ``CODE_CACHED_KERNELS``
in between keeps its code cached in the replay (``code_cache_state``).  Without that, the keys'
rotary ``mul`` of the H100 Llama model replayed at 1.14-1.16x its in-model duration.

Between the two lies a third state: code gone from the instruction caches but still in the
last-level cache, fetched through it like data, where the model moved fewer bytes since the
kernels' previous call than a working set survives in (``Profiling Code Reuse Distance(B)``).
The FP8 model's per-token division on an H100 took 3.70 us in the model on average, 4.40-4.45 us
replayed with every cache evicted, and 3.68-3.71 us with a call of the kernel on other inputs
between the data eviction and the code eviction (``reproduce/wip/code_l2_effect.py``): the call
leaves the code in the last-level cache and the code eviction takes it out of the instruction
caches only.

``code_eviction`` builds the distinct kernels: element-wise functions, reductions, a softmax and
a scan, each over three floating dtypes, each on a tensor large enough to occupy every compute
unit (a kernel on a few blocks refreshes the caches of a few units only: the prefill sum then
got 8.4-9.2 us instead of 10.2).  The tensor's shape, two primes, is one no database row is
likely to have, so a collector that tells kernels apart by shape (msprof's) does not mistake
them for a row's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.reuse_cell import parse_reuse_cell
from perf_plugin.database.schema import CODE_REUSE, PROFILING_CODE_REUSE, PROFILING_COUNTER_PREFIX

if TYPE_CHECKING:
    import torch

    from perf_plugin.replay.tensors import KernelRow

# A kernel whose model ran at most this many distinct kernels since its previous call found its
# code in the instruction caches.  Kernels over the whole device evict it after 2-4 (the sweep
# of reproduce/wip/code_cache_effect.py on an H100); a model's decode kernels mostly run on a few
# SMs and evict less.  Over three decoder models profiled on an H100, 4 to 6 put the most kernel
# time within 10 % of its in-model duration, 8 and more less (README, "Coverage of real profiles").
CODE_CACHED_KERNELS = 6.0
# The share of the last-level cache a kernel's code survives in: every SM fetches it, and the L2
# of an H100 or H200 holds a line the SMs of both its partitions read in each, so traffic of half
# the cache since the kernel's last call evicts it.
CODE_CACHED_SHARE = 0.5
CODE_REUSE_COLUMN = PROFILING_COUNTER_PREFIX + CODE_REUSE

# Element-wise functions with distinct kernels (one each per dtype).
_UNARY_NAMES = ("sin", "cos", "exp", "log1p", "tanh", "sigmoid", "abs", "sqrt", "erf", "reciprocal")
_DTYPE_NAMES = ("float32", "bfloat16", "float16")


def code_eviction(device: "torch.device", shape: tuple[int, int]) -> Callable[[], None]:
    """A no-argument call launching ~40 distinct kernels on ``device``, each over a ``shape``
    tensor, whose results are dropped; built once (the tensors), called before every repeat."""
    calls = distinct_kernels(device, shape)

    def evict_code() -> None:
        for call in calls:
            call()

    return evict_code


def distinct_kernels(device: "torch.device", shape: tuple[int, int]) -> list[Callable[[], Any]]:
    """The calls ``code_eviction`` makes, one distinct kernel each, dtype by dtype."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(0)
    calls: list[Callable[[], Any]] = []
    for name in _DTYPE_NAMES:
        tensor = torch.rand(shape, generator=generator).to(device=device, dtype=getattr(torch, name))
        calls += [functools.partial(getattr(torch, function), tensor) for function in _UNARY_NAMES]
        calls += [functools.partial(torch.amax, tensor, dim=-1), functools.partial(torch.mean, tensor, dim=0),
                  functools.partial(torch.softmax, tensor, dim=-1), functools.partial(torch.cumsum, tensor, dim=-1)]
    return calls


class CodeCache(Enum):
    """Where a row's kernels found their code in the profiled model."""

    INSTRUCTION = "instruction caches"  # few kernels ran in between
    LAST_LEVEL = "last-level cache"  # more, but moving little data
    MEMORY = "memory"  # or no evidence


def code_cache_state(row: "KernelRow", cache_bytes: int) -> CodeCache:
    """Where the row's profile shows its kernels found their code, for a replay on a device with
    a last-level cache of ``cache_bytes`` (``MEMORY`` where the row has no evidence).

    Raises DatabaseError naming the column of a bad cell."""
    if _code_cached(row):
        return CodeCache.INSTRUCTION
    try:
        moved = parse_reuse_cell(row.attrs.get(PROFILING_CODE_REUSE, ""))
    except DatabaseError as exc:
        raise exc.located(column=PROFILING_CODE_REUSE) from None
    if moved and moved[0] < cache_bytes * CODE_CACHED_SHARE:
        return CodeCache.LAST_LEVEL
    return CodeCache.MEMORY


def _code_cached(row: "KernelRow") -> bool:
    """Whether the row's profile shows its kernels found their code in the instruction caches
    (False without one).  Raises DatabaseError naming the column when the cell is not a number."""
    cell = row.attrs.get(CODE_REUSE_COLUMN, "").strip()
    if not cell:
        return False
    try:
        distance = float(cell)
    except ValueError:
        raise DatabaseError(f"{cell!r} is not a number of kernels", column=CODE_REUSE_COLUMN) from None
    return distance <= CODE_CACHED_KERNELS


def in_order(*steps: Callable[[], Any] | None) -> Callable[[], None]:
    """A no-argument call running ``steps`` one after another (a None among them is no step)."""
    calls = [step for step in steps if step is not None]

    def run() -> None:
        for call in calls:
            call()

    return run
