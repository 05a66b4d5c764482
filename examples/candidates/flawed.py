"""Two flawed candidates, to see the judge catch them (``--perf-candidate examples/candidates/flawed.py``).

* RmsNorm that forgets the weight (``gamma``): fast, and wrong wherever gamma is not all ones;
* SwiGlu computed in float64 and cast back: correct, and slower than the replay's own kernel.
"""

from __future__ import annotations

import torch

from perf_plugin.candidates import candidate


@candidate("RmsNorm")
def rmsnorm_without_gamma(x: torch.Tensor, gamma: torch.Tensor, shape: list[int], eps: float,
                          with_rstd: bool) -> object:
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    rstd = torch.rsqrt(x.float().pow(2).mean(dims, keepdim=True) + eps)
    y = (x.float() * rstd).to(x.dtype)  # the weight is never applied
    return (y, rstd) if with_rstd else y


@candidate("SwiGlu")
def swiglu_in_float64(x: torch.Tensor, dim: int) -> torch.Tensor:
    a, b = x.double().chunk(2, dim)
    return (torch.nn.functional.silu(a) * b).to(x.dtype)
