"""Buffers, expected results and the call of one collective case (torch imported lazily).

Inputs are deterministic per rank, so every rank can check its own result exactly:

* all_gather: rank ``r`` sends elements ``r*c .. r*c+c-1`` of the pattern ``(i % 127) + 1``;
  every rank must receive the whole pattern;
* all_to_all: rank ``r`` sends the pattern starting at ``r * count``, chunk ``k`` of it to rank
  ``k``; rank ``g`` must receive chunk ``g`` of every sender, in rank order;
* all_reduce and reduce_scatter: rank ``r`` holds ``((r + i) % Q) + 1`` with ``Q = 127 // n``,
  so every sum stays at or below 127 and is exact in bf16, fp16, fp32 and int8 whatever the
  reduction order; reduce_scatter's rank ``g`` must get chunk ``g`` of the sum.

All values are small positive integers: never zero (a zero hides an unwritten output) and
exactly representable, so the comparison is exact.  Only groups beyond 127 ranks (where the
bound cannot hold) compare floats with a relative tolerance of ``n`` units in the last place,
and int8 sums with two's-complement wrap-around, as NCCL and gloo add int8.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perf_plugin.comm.plan import CommCase

if TYPE_CHECKING:
    import torch

PATTERN_MODULUS = 127


@dataclass
class CaseBuffers:
    send: "torch.Tensor"
    receive: "torch.Tensor"  # the same tensor as ``send`` for all_reduce (in place)
    expected: "torch.Tensor | None"
    rtol: float  # 0.0: exact comparison


def _pattern(offset: int, count: int, modulus: int, dtype: "torch.dtype", device: Any) -> "torch.Tensor":
    """``((offset + i) % modulus) + 1`` for i in [0, count), built in int32 then cast."""
    import torch

    start = offset % modulus
    values = torch.arange(start, start + count, dtype=torch.int32, device=device)
    values.remainder_(modulus).add_(1)
    return values.to(dtype)


def _reduction_modulus(n: int) -> int:
    return max(1, PATTERN_MODULUS // n)


def _finish_sum(acc: "torch.Tensor", case: CommCase, torch_dtype: "torch.dtype", n: int) -> tuple["torch.Tensor", float]:
    """The expected sum in the case's dtype, and the tolerance it is compared with."""
    peak = n * _reduction_modulus(n)
    if not case.dtype.floating:
        wrapped = (acc + 128).remainder_(256).sub_(128)  # two's-complement int8 addition
        return wrapped.to(torch_dtype), 0.0
    exact = peak <= case.dtype.exact_integer_limit()
    return acc.to(torch_dtype), 0.0 if exact else n * 2.0 ** -case.dtype.mantissa_bits


def build_buffers(case: CommCase, group_rank: int, device: Any, with_expected: bool = True) -> CaseBuffers:
    """Send/receive buffers of this rank (allocated once per case) and its expected result."""
    import torch

    dtype = getattr(torch, case.dtype.torch_name)
    n = case.num_devices
    count = case.count
    chunk = count // n
    name = case.op.name
    expected = None
    rtol = 0.0
    if name == "all_gather":
        send = _pattern(group_rank * chunk, chunk, PATTERN_MODULUS, dtype, device)
        receive = torch.empty(count, dtype=dtype, device=device)
        if with_expected:
            expected = _pattern(0, count, PATTERN_MODULUS, dtype, device)
    elif name == "all_to_all":
        send = _pattern(group_rank * count, count, PATTERN_MODULUS, dtype, device)
        receive = torch.empty(count, dtype=dtype, device=device)
        if with_expected:
            expected = torch.cat(
                [_pattern((src * n + group_rank) * chunk, chunk, PATTERN_MODULUS, dtype, device) for src in range(n)]
            )
    else:
        q = _reduction_modulus(n)
        send = _pattern(group_rank, count, q, dtype, device)
        receive = send if name == "all_reduce" else torch.empty(chunk, dtype=dtype, device=device)
        if with_expected:
            acc = torch.zeros(count, dtype=torch.int32, device=device)
            for src in range(n):
                acc += _pattern(src, count, q, torch.int32, device)
            if name == "reduce_scatter":
                acc = acc[group_rank * chunk : (group_rank + 1) * chunk].clone()
            expected, rtol = _finish_sum(acc, case, dtype, n)
    return CaseBuffers(send, receive, expected, rtol)


def make_call(case: CommCase, buffers: CaseBuffers, group: Any) -> Callable[[], Any]:
    """A no-argument closure running the collective once (synchronous API, no host sync)."""
    import torch.distributed as dist

    send, receive = buffers.send, buffers.receive
    name = case.op.name
    if name == "all_reduce":
        return lambda: dist.all_reduce(send, group=group)
    if name == "all_gather":
        # all_gather_single is the newer name of all_gather_into_tensor (same semantics)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(receive, send, group=group)
    if name == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(receive, send, group=group)
    if name == "all_to_all":
        return lambda: dist.all_to_all_single(receive, send, group=group)
    raise ValueError(f"unknown collective {name!r}")


def check_result(buffers: CaseBuffers) -> str | None:
    """None when the received buffer equals the expected one; else what differs, in one line."""
    import torch

    got, want = buffers.receive, buffers.expected
    if want is None:
        return None
    if got.shape != want.shape:
        return f"result has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if buffers.rtol == 0.0:
        bad = got != want
    else:
        got64, want64 = got.double(), want.double()
        bad = ~torch.isfinite(got64) | ((got64 - want64).abs() > buffers.rtol * want64.abs())
    wrong = int(bad.sum().item())
    if wrong == 0:
        return None
    first = int(bad.nonzero()[0, 0].item())
    limit = "exactly" if buffers.rtol == 0.0 else f"within rtol {buffers.rtol:.3g}"
    return (
        f"{wrong} of {got.numel()} elements differ ({limit}); first at index {first}: "
        f"got {got[first].item()!r}, expected {want[first].item()!r}"
    )
