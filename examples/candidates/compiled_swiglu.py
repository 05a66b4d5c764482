"""A torch.compile'd SwiGlu candidate for ``pytest bench --perf-candidate examples/candidates/compiled_swiglu.py``.

It takes the SwiGlu replay's arguments (``x, dim``) and returns ``silu(a) * b`` for the two
halves of ``x`` along ``dim``, compiled by Inductor (one fused Triton kernel on CUDA, C++ on the
CPU, which needs a compiler).  Compilation happens at the first call, in the candidate's first
correctness check, outside the timed repeats.
"""

from __future__ import annotations

import torch

from perf_plugin.candidates import candidate

# One compiled graph per row shape: a production database has more SwiGlu shapes than Dynamo's
# default recompile limit (8), past which it would silently run the eager function instead.
_dynamo_config = torch._dynamo.config
for _name in ("recompile_limit", "cache_size_limit"):
    if hasattr(_dynamo_config, _name):
        setattr(_dynamo_config, _name, max(getattr(_dynamo_config, _name), 4096))


def _swiglu(x: torch.Tensor, dim: int) -> torch.Tensor:
    a, b = x.chunk(2, dim)
    return torch.nn.functional.silu(a) * b


# dynamic=False: a kernel specialised to each row's shape, as a serving engine would compile it
_compiled = torch.compile(_swiglu, dynamic=False)


@candidate("SwiGlu")
def swiglu(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _compiled(x, dim)  # type: ignore[no-any-return]
