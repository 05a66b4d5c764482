"""DispatchFFNCombine over an expert-parallel group: the portable run and its reference on ``EP Size`` ranks.

Each of the group's ``G`` ranks holds ``M`` tokens and ``E`` experts (global ids ``rank * E ..
rank * E + E - 1``); a token's ``k`` expert ids span all ``G * E`` experts.  The kernel sends every
(token, slot) pair to the rank owning its expert, runs the quantised SwiGLU FFN there, sends the
result back and combines it with the routing probability (the semantics of
``perf_plugin.replay.kernels.dispatch_ffn_combine`` on one rank); ``expert_token_nums`` on a rank
counts the pairs its experts received from every rank.

The portable ``run`` does the same with ``torch.distributed`` collectives of the group (gloo on
the CPU): all-gather of the tokens, expert ids and probabilities (the dispatch), the FFN of this
rank's experts on the pairs routed to them, and an all-reduce of the weighted results (the
combine: each rank adds its experts' contributions to every token, and keeps its own tokens').
Quantisation is per token, as on one rank, so it does not matter where it happens.  The
reference is float64, expert by expert, on the gathered inputs; the cross-rank sum of its
per-rank parts is taken in float32 on the inputs' device (the group's collective library works
there), far below the 16-bit output's tolerance.  Every rank calls the same collectives in the
same order, as the kernel does: every rank of the session runs every case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.kernels._grouped_gemm import Groups, can_fuse, grouped_mm

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class EpShape:
    tokens: int  # M, per rank
    hidden: int
    inter: int
    experts: int  # E, per rank
    top_k: int


def _gather(tensor: "torch.Tensor", group: Any) -> "torch.Tensor":
    """Every rank's ``tensor`` stacked along dim 0, in rank order."""
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts)


def _local_pairs(ids: "torch.Tensor", rank: int, experts: int) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """(token, slot, local expert) of the pairs routed to this rank's experts, sorted by expert."""
    import torch

    local = ids.long() - rank * experts
    token, slot = ((local >= 0) & (local < experts)).nonzero(as_tuple=True)
    expert = local[token, slot]
    order = torch.argsort(expert, stable=True)
    return token[order], slot[order], expert[order]


def _quantise_rows(values: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """Int8-valued rows (round half to even) and their per-row scales ``max|v| / 127``."""
    import torch

    scale = values.abs().amax(dim=1) / 127
    return torch.round(values / scale.unsqueeze(1)), scale


def run_ep(
    x: "torch.Tensor", w1: "torch.Tensor", w2: "torch.Tensor", ids: "torch.Tensor", scale1: "torch.Tensor",
    scale2: "torch.Tensor", probs: "torch.Tensor", shape: EpShape, group: Any, rank: int,
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """This rank's ``out [M, H]`` and ``expert_token_nums [E]``; ``scale1``/``scale2`` are decoded float32."""
    import torch
    import torch.distributed as dist

    all_x, all_ids, all_probs = _gather(x, group), _gather(ids, group), _gather(probs.float(), group)
    token, slot, expert = _local_pairs(all_ids, rank, shape.experts)
    sizes = torch.bincount(expert.cpu(), minlength=shape.experts)
    groups = Groups(
        tuple(int(v) for v in sizes.tolist()),
        can_fuse("FLOAT", shape.hidden, 2 * shape.inter, x.device) and can_fuse("FLOAT", shape.inter, shape.hidden, x.device),
    )
    offsets = sizes.cumsum(0).int().to(x.device)
    xq64, sx64 = _quantise_rows(all_x.double())  # 16-bit inputs put 127 * x / max|x| on ties: float64 as on one rank
    xq, sx = xq64.float(), sx64.float()
    h = grouped_mm(xq.index_select(0, token), w1.float(), offsets, groups)
    h.mul_(scale1.view(shape.experts, -1).index_select(0, expert)).mul_(sx.index_select(0, token).unsqueeze(1))
    act, gate = h[:, : shape.inter], h[:, shape.inter :]
    sq, s2 = _quantise_rows(act / (1 + torch.exp(-act)) * gate)
    y = grouped_mm(sq, w2.float(), offsets, groups)
    y.mul_(scale2.view(shape.experts, -1).index_select(0, expert)).mul_(s2.unsqueeze(1))
    combined = torch.zeros((all_x.shape[0], shape.hidden), dtype=torch.float32, device=x.device)
    combined.index_add_(0, token, y * all_probs[token, slot].unsqueeze(1))
    dist.all_reduce(combined, group=group)
    mine = combined[rank * shape.tokens : (rank + 1) * shape.tokens]
    return mine.to(x.dtype), sizes.int().to(x.device)


def reference_ep(
    x: "torch.Tensor", w1: "torch.Tensor", w2: "torch.Tensor", ids: "torch.Tensor", scale1: "torch.Tensor",
    scale2: "torch.Tensor", probs: "torch.Tensor", shape: EpShape, group: Any, rank: int,
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Float64, one local expert at a time, from the token-major ids (no permutation)."""
    import torch
    import torch.distributed as dist

    all_x = _gather(x, group).detach().cpu().double()
    all_ids = _gather(ids, group).detach().cpu().long()
    all_probs = _gather(probs.float(), group).detach().cpu().double()
    xq, sx = _quantise_rows(all_x)
    s1, s2 = scale1.detach().cpu().double().view(shape.experts, -1), scale2.detach().cpu().double().view(shape.experts, -1)
    part = torch.zeros((all_x.shape[0], shape.hidden), dtype=torch.float64)
    tally = torch.zeros(shape.experts, dtype=torch.int32)
    for e in range(shape.experts):
        token, slot = (all_ids == rank * shape.experts + e).nonzero(as_tuple=True)
        tally[e] = token.numel()
        if not token.numel():
            continue
        h = (xq[token] @ w1[e].detach().cpu().double()) * s1[e] * sx[token].unsqueeze(1)
        act, gate = h.chunk(2, dim=1)
        sq, s2_tok = _quantise_rows(act / (1 + torch.exp(-act)) * gate)
        y = (sq @ w2[e].detach().cpu().double()) * s2[e] * s2_tok.unsqueeze(1)
        part.index_add_(0, token, y * all_probs[token, slot].unsqueeze(1))
    total = part.to(device=x.device, dtype=torch.float32)
    dist.all_reduce(total, group=group)
    mine = total[rank * shape.tokens : (rank + 1) * shape.tokens].detach().cpu().double()
    return mine, tally
