"""A Triton RMSNorm candidate for ``pytest bench --perf-candidate examples/candidates/triton_rmsnorm.py``.

It takes the RmsNorm replay's arguments (``x, gamma, normalized_shape, eps, with_rstd``) and
returns ``y`` or ``(y, rstd)`` like ``torch._fused_rms_norm``: one program per row of the
flattened input, float32 accumulation, rstd in float32.  CUDA only: on a machine without
Triton or a GPU the file imports and registers nothing (the run says so).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from perf_plugin.candidates import candidate

try:  # Triton ships with CUDA builds of torch only
    import triton
    import triton.language as tl
except ImportError:
    triton = None

# Elements per block of a row: rows longer than this are walked in blocks.
MAX_BLOCK = 8192

if triton is not None and torch.cuda.is_available():

    @triton.jit
    def _rms_norm_rows(X, W, Y, RSTD, N, eps, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        row = tl.program_id(0).to(tl.int64)
        x_row = X + row * N
        y_row = Y + row * N
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < N, other=0.0).to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
        tl.store(RSTD + row, rstd)
        for start in range(0, N, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)

    @candidate("RmsNorm")
    def rms_norm(x: torch.Tensor, gamma: torch.Tensor, shape: list[int], eps: float, with_rstd: bool) -> Any:
        if x.dtype == torch.float64 or not x.is_cuda:
            # Triton has no float64 path worth timing: the eager op (its speedup is ~1)
            y, rstd = torch._fused_rms_norm(x, shape, gamma, eps)  # type: ignore[attr-defined]
            return (y, rstd) if with_rstd else y
        n = math.prod(shape)
        rows = x.numel() // n if n else 0
        x2 = x.contiguous()
        y = torch.empty_like(x2)
        rstd = torch.empty(x.shape[: x.dim() - len(shape)] + (1,) * len(shape), dtype=torch.float32, device=x.device)
        if rows:
            block = min(MAX_BLOCK, triton.next_power_of_2(n))
            _rms_norm_rows[(rows,)](x2, gamma.contiguous(), y, rstd, n, eps, BLOCK=block, num_warps=8 if block >= 2048 else 4)
        return (y, rstd) if with_rstd else y
