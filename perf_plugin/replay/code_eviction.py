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

``code_eviction`` builds the distinct kernels: element-wise functions, reductions, a softmax and
a scan, each over three floating dtypes, each on a tensor large enough to occupy every compute
unit (a kernel on a few blocks refreshes the caches of a few units only: the prefill sum then
got 8.5 us instead of 10.2).  The tensor's shape, two primes, is one no database row is likely to
have, so a collector that tells kernels apart by shape (msprof's) does not mistake them for a
row's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Element-wise functions with distinct kernels (one each per dtype).
_UNARY_NAMES = ("sin", "cos", "exp", "log1p", "tanh", "sigmoid", "abs", "sqrt", "erf", "reciprocal")
_DTYPE_NAMES = ("float32", "bfloat16", "float16")


def code_eviction(device: "torch.device", shape: tuple[int, int]) -> Callable[[], None]:
    """A no-argument call launching ~40 distinct kernels on ``device``, each over a ``shape``
    tensor, whose results are dropped; built once (the tensors), called before every repeat."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(0)
    tensors = [torch.rand(shape, generator=generator).to(device=device, dtype=getattr(torch, name))
               for name in _DTYPE_NAMES]
    unary: list[Callable[[Any], Any]] = [getattr(torch, name) for name in _UNARY_NAMES]

    def evict_code() -> None:
        for tensor in tensors:
            for function in unary:
                function(tensor)
            tensor.amax(dim=-1)
            tensor.mean(dim=0)
            torch.softmax(tensor, dim=-1)
            torch.cumsum(tensor, dim=-1)

    return evict_code


def then(first: Callable[[], Any], second: Callable[[], Any]) -> Callable[[], None]:
    """A no-argument call running ``first``, then ``second``."""

    def both() -> None:
        first()
        second()

    return both
