"""Evicting the device's instruction caches before a timed repeat, as a model run leaves them.

An eager model runs some hundred distinct kernels between two calls of one kernel, so each call
fetches its code (from the last-level cache or memory) into the compute units' instruction
caches.  A replay runs one kernel over and over: with only the data eviction and the input
rewrite between repeats, the kernel's code stays in those caches and the repeat skips the fetch.
The difference is not small for short kernels: on an H100, the Qwen3-MoE decode step's sum over
its 8 experts (``[1,8,2048]`` bf16) took 5.05 us in the model and 3.9 us replayed in ``produced``;
with the distinct kernels below run before each repeat, 5.5 us.  Its prefill counterpart went from
8.3 to 10.2 us (10.3 us in the model), an MoE ``mul`` from 2.02 to 2.30 us (2.45), a
``masked_fill`` from 2.08 to 2.36 us (2.66); prefill GEMMs moved by 2-4 %
(``reproduce/wip/code_cache_effect.py``).  The kernels' data is not what moves them: run before
the data eviction, so that it leaves no line of theirs dirty, the figures are the same.

Not every kernel of a model finds its code evicted: rotary embedding runs its ``mul``, ``neg`` and
``cat`` for the queries and, a few kernels later, for the keys.  Ingest records the share of a
row's calls whose kernels ran few enough distinct kernels before to find their code cached
(``Profiling Average Code Cached``, ``perf_plugin.ingest.code_reuse``), and the replay evicts the
code before the other share of its repeats, spread evenly over them (``code_evicted_share``,
``on_share``).  Evicting it before every repeat made the keys' rotary ``mul`` of the H100 Llama
model replay at 1.14-1.16x its in-model duration.

``code_eviction`` builds the distinct kernels: element-wise functions, reductions, a softmax and
a scan, each over three floating dtypes, each on a tensor large enough to occupy every compute
unit (a kernel on a few blocks refreshes the caches of a few units only: the prefill sum then
got 8.5 us instead of 10.2).  The tensor's shape, two primes, is one no database row is likely to
have, so a collector that tells kernels apart by shape (msprof's) does not mistake them for a
row's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import CODE_CACHED, PROFILING_COUNTER_PREFIX

if TYPE_CHECKING:
    import torch

    from perf_plugin.replay.tensors import KernelRow

CODE_CACHED_COLUMN = PROFILING_COUNTER_PREFIX + CODE_CACHED

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


def code_evicted_share(row: "KernelRow") -> float:
    """The share of the row's repeats to evict the code before: the share of its profiled calls
    that found their code evicted (all of them where the row has no such evidence).

    Raises DatabaseError naming the column when the cell is not a share."""
    cell = row.attrs.get(CODE_CACHED_COLUMN, "").strip()
    if not cell:
        return 1.0
    try:
        cached = float(cell)
    except ValueError:
        cached = math.nan
    if not 0.0 <= cached <= 1.0:
        raise DatabaseError(f"{cell!r} is not a share between 0 and 1", column=CODE_CACHED_COLUMN)
    return 1.0 - cached


def on_share(call: Callable[[], Any], share: float) -> Callable[[], None]:
    """A no-argument call that runs ``call`` on ``share`` of its calls, spread evenly (the k-th
    call runs it when the running count of ``share`` per call passes a whole number)."""
    calls = 0

    def sometimes() -> None:
        nonlocal calls
        calls += 1
        if math.floor(calls * share + 1e-9) > math.floor((calls - 1) * share + 1e-9):
            call()

    return sometimes


def then(first: Callable[[], Any], second: Callable[[], Any]) -> Callable[[], None]:
    """A no-argument call running ``first``, then ``second``."""

    def both() -> None:
        first()
        second()

    return both
