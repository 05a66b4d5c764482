"""Variable-length (TND) flash attention: the requests a ``FlashAttentionScore`` row packs, and the math that runs them.

A TND row packs B requests of unequal lengths into one query ``[T, N, D]`` and one key/value
``[T_kv, N_kv, D]``; ``actual_seq_qlen`` (slot 8) and ``actual_seq_kvlen`` (slot 9), INT64 ``[B]``,
are each request's cumulative end (torch_npu's TND convention).  The kernel's time depends on
those values, not only on T: a causal prefill costs the sum of the squares of its requests'
lengths.  The row carries them in ``Input Values`` (slots 8 and 9) where a capture recorded them
(``perf_plugin.capture``: ``torch_npu.npu_fusion_attention``'s ``actual_seq_qlen`` /
``actual_seq_kvlen``, or ``torch.nn.attention.varlen.varlen_attn``'s ``cu_seq_q`` / ``cu_seq_k``
without their leading 0); otherwise the replay splits T and T_kv as evenly as they go
(``EVEN_LENGTHS``, written in ``Input Values Source`` at ingest).

A present ``atten_mask`` (the 2048x2048 compressed mask) makes the row causal, each request's
mask aligned to its bottom right (``sparse_mode`` 3, ``rightDownCausal``), which is what
flash-attention's varlen kernel does with ``is_causal``; the two alignments agree where a
request's query and KV lengths are equal (a prefill).

Where it runs: on an NPU ``npu_fusion_attention(..., input_layout="TND", actual_seq_qlen,
actual_seq_kvlen, sparse_mode)``; on CUDA (fp16/bf16, D <= 256) ``aten._flash_attention_forward``
with the cumulative offsets, the kernel ``varlen_attn`` runs; elsewhere one fused attention per
request.  References: float64 per request, in chunks of queries, on CUDA where the copies fit
(``OpReplay.reference_on_device``), else on the CPU.  ``softmax_max`` / ``softmax_sum`` rows
(``[T, N, 8]``, an NPU's) get ``(lse, 1)`` off the NPU, as the dense layouts do
(``perf_plugin.replay.kernels.flash_attention``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

from perf_plugin.database.schema import INPUT_VALUES
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels._flash_attention_math import COMPRESSED_MASK, STATS_WIDTH
from perf_plugin.replay.kernels.mla_prefill import distribute, lengths_from_cumulative
from perf_plugin.replay.value_draws import recorded_values
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

Q_LENS, KV_LENS = 8, 9  # actual_seq_qlen, actual_seq_kvlen
MASK = 6
NO_MASK, RIGHT_DOWN_CAUSAL = 0, 3  # sparse_mode values
_SCORES_CHUNK = 1 << 25  # float64 scores per step of the reference (256 MB)
# What a TND row without recorded lengths replays (``Input Values Source``).
EVEN_LENGTHS = "even lengths"
_EMPTY_AFTER = range(10, 15)  # q_start_idx, kv_start_idx, the FP8 scales: not replayed


def _slot(side: tuple[TensorSpec, ...], index: int) -> TensorSpec:
    return side[index] if index < len(side) else TensorSpec(None, "")


def is_varlen(row: KernelRow) -> bool:
    """Whether a FlashAttentionScore row is the TND layout: a 3-D query and ``actual_seq_qlen``."""
    q = _slot(row.inputs, 0)
    return q.shape is not None and len(q.shape) == 3 and _slot(row.inputs, Q_LENS).present


@dataclass(frozen=True)
class VarlenPlan:
    """The requests of a TND row and how the kernel treats them."""

    heads: int
    kv_heads: int
    head_dim: int
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    causal: bool
    stats: bool  # whether the row records softmax_max / softmax_sum ([T, N, 8])
    measured: bool  # lengths from the row's Input Values, not EVEN_LENGTHS

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def sparse_mode(self) -> int:
        return RIGHT_DOWN_CAUSAL if self.causal else NO_MASK

    @property
    def q_ends(self) -> list[int]:
        return list(accumulate(self.q_lens))

    @property
    def kv_ends(self) -> list[int]:
        return list(accumulate(self.kv_lens))

    @property
    def tokens(self) -> int:
        return sum(self.q_lens)


def _lengths(row: KernelRow, slot: int, total: int, batch: int, what: str) -> tuple[tuple[int, ...], bool]:
    ends = recorded_values(row, slot)
    if ends is None:
        return tuple(distribute(total, batch)), False
    if len(ends) != batch:
        raise CaseBuildError(f"{row.kernel_type}: '{INPUT_VALUES}' slot {slot} holds {len(ends)} {what} ends for a "
                             f"[{batch}] {what} input")
    return tuple(lengths_from_cumulative(ends, total, f"{row.kernel_type}: '{INPUT_VALUES}' slot {slot} ({what})")), True


def varlen_plan(row: KernelRow) -> VarlenPlan:
    """The plan of a TND row; CaseBuildError naming what does not fit."""
    q, k, v = (_slot(row.inputs, i) for i in range(3))
    kind = row.kernel_type
    if q.shape is None or k.shape is None or v.shape is None or len(k.shape) != 3 or v.shape != k.shape:
        raise CaseBuildError(f"{kind} TND needs query [T,N,D] and key = value [T_kv,N_kv,D] in slots 0-2, got "
                             f"{shape_text(q)} / {shape_text(k)} / {shape_text(v)}")
    if len({q.dtype, k.dtype, v.dtype}) != 1 or q.dtype not in FLOATING:
        raise CaseBuildError(f"{kind}: query, key and value must share one floating dtype, got {q.dtype};{k.dtype};{v.dtype}")
    (tokens, heads, dim), (kv_tokens, kv_heads, kv_dim) = q.shape, k.shape
    if kv_dim != dim or kv_heads == 0 or heads % kv_heads:
        raise CaseBuildError(f"{kind}: key {shape_text(k)} does not fit query {shape_text(q)} (same D, KV heads dividing N)")
    for i, name in ((3, "pse"), (4, "drop_mask"), (5, "padding_mask"), (7, "prefix"), *((i, "optional input") for i in _EMPTY_AFTER)):
        if _slot(row.inputs, i).present:
            raise CaseBuildError(f"{kind} {name} (slot {i}) {shape_text(row.inputs[i])} is present: not replayed")
    mask = _slot(row.inputs, MASK)
    if mask.present and (mask.shape != COMPRESSED_MASK or mask.dtype not in ("BOOL", "UINT8")):
        raise CaseBuildError(f"{kind} atten_mask (slot {MASK}) {shape_text(mask)} {mask.dtype}: only the 2048x2048 "
                             "compressed causal mask (sparse_mode 3) is replayed")
    q_slot, kv_slot = _slot(row.inputs, Q_LENS), _slot(row.inputs, KV_LENS)
    if q_slot.shape is None or len(q_slot.shape) != 1 or kv_slot.shape != q_slot.shape or not q_slot.shape[0]:
        raise CaseBuildError(f"{kind} TND needs actual_seq_qlen and actual_seq_kvlen [B] (slots 8, 9), got "
                             f"{shape_text(q_slot)} / {shape_text(kv_slot)}")
    batch = q_slot.shape[0]
    q_lens, q_measured = _lengths(row, Q_LENS, tokens, batch, "query")
    kv_lens, kv_measured = _lengths(row, KV_LENS, kv_tokens, batch, "KV")
    for i, (sq, skv) in enumerate(zip(q_lens, kv_lens)):
        # a query with no key to attend to (or, causal, above its request's diagonal) has no softmax
        if sq and (not skv or (mask.present and sq > skv)):
            raise CaseBuildError(f"{kind}: request {i} has {sq} query and {skv} KV tokens: a query with nothing to "
                                 "attend to" + (" (causal, bottom-right aligned)" if mask.present else ""))
    stats = _stats(row, tokens, heads)
    return VarlenPlan(heads, kv_heads, dim, q_lens, kv_lens, mask.present, stats, q_measured or kv_measured)


def _stats(row: KernelRow, tokens: int, heads: int) -> bool:
    outs = row.outputs
    if len(outs) != 4 or outs[2].present or _slot(outs, 3).shape != _slot(row.inputs, 0).shape:
        raise CaseBuildError(f"{row.kernel_type} needs outputs softmax_max;softmax_sum;(empty softmax_out);"
                             "attention_out of the query's shape")
    if not outs[0].present and not outs[1].present:
        return False
    expected = (tokens, heads, STATS_WIDTH)
    for name, spec in (("softmax_max", outs[0]), ("softmax_sum", outs[1])):
        if spec.shape != expected or spec.dtype != "FLOAT":
            raise CaseBuildError(f"{row.kernel_type} {name} {shape_text(spec)} {spec.dtype} should be "
                                 f"{shape_text(expected)} FLOAT in TND")
    return True


# ----------------------------------------------------------------------------- computation
def _flash_varlen_on_cuda(q: "torch.Tensor", plan: VarlenPlan) -> bool:
    import torch

    return q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16) and plan.head_dim <= 256


def offsets(plan: VarlenPlan, device: "torch.device") -> tuple["torch.Tensor", "torch.Tensor"]:
    """``cu_seq_q`` / ``cu_seq_k``: int32 ``[B + 1]`` starting at 0, as the CUDA kernel takes them."""
    import torch

    return (torch.tensor([0, *plan.q_ends], dtype=torch.int32, device=device),
            torch.tensor([0, *plan.kv_ends], dtype=torch.int32, device=device))


def _bottom_right(sq: int, skv: int, device: "torch.device") -> "torch.Tensor":
    """The allowed pairs of a causal request aligned to its bottom right: query i sees keys up to i + skv - sq."""
    import torch

    return torch.ones(sq, skv, dtype=torch.bool, device=device).tril(skv - sq)


def varlen_forward(
    q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", plan: VarlenPlan,
    cu: "tuple[torch.Tensor, torch.Tensor] | None" = None,
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(out [T, N, D], lse [T, N] float32): one varlen kernel on CUDA, else a fused attention per request."""
    import torch

    if cu is not None and _flash_varlen_on_cuda(q, plan):
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu[0], cu[1], max(plan.q_lens), max(plan.kv_lens), 0.0, plan.causal, False, scale=plan.scale
        )
        return out, lse.transpose(0, 1)  # the varlen kernel's lse is [N, T]
    outs, lses = [], []
    for (q0, q1), (k0, k1) in zip(_spans(plan.q_lens), _spans(plan.kv_lens)):
        if q1 == q0:
            continue
        qi, ki, vi = (t.transpose(0, 1).unsqueeze(0) for t in (q[q0:q1], k[k0:k1], v[k0:k1]))
        out, lse = _one_request(qi, ki, vi, plan)
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0].transpose(0, 1))
    return torch.cat(outs), torch.cat(lses)


def _spans(lengths: tuple[int, ...]) -> list[tuple[int, int]]:
    ends = list(accumulate(lengths))
    return list(zip([0, *ends[:-1]], ends))


def _one_request(
    q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", plan: VarlenPlan
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """One request's (out, lse) on BNSD views through aten's fused CPU attention (an explicit
    bottom-right mask through the efficient kernel elsewhere, where the query is shorter)."""
    import torch

    sq, skv = q.shape[2], k.shape[2]
    group = plan.heads // plan.kv_heads
    if q.device.type in ("cpu", "meta") and (not plan.causal or sq == skv):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, plan.causal,
                                                                              scale=plan.scale)[:2]
        return out, lse
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * plan.scale
    if plan.causal:
        scores = scores.masked_fill(~_bottom_right(sq, skv, q.device), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    out = (torch.softmax(scores, -1) @ v.float()).to(q.dtype)
    return out, lse


def varlen_reference(
    q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", plan: VarlenPlan, where: "torch.device | None" = None
) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """(out [T, N, D], row max [T, N], row sum [T, N]) in float64 on ``where`` (the CPU by
    default), one request and ``_SCORES_CHUNK`` scores at a time: a prefill of 16384-token
    requests holds 8.6e9 scores per request, which no device holds in float64 at once."""
    import torch

    where = where if where is not None else torch.device("cpu")
    group = plan.heads // plan.kv_heads
    outs, peaks, totals = [], [], []
    for (q0, q1), (k0, k1) in zip(_spans(plan.q_lens), _spans(plan.kv_lens)):
        if q1 == q0:
            continue
        queries = q[q0:q1].to(where, torch.float64).transpose(0, 1)  # [N, Sq, D]
        keys, values = (t[k0:k1].to(where, torch.float64).transpose(0, 1).repeat_interleave(group, 0) for t in (k, v))
        rows = max(1, _SCORES_CHUNK // (plan.heads * (k1 - k0)))
        for start in range(0, q1 - q0, rows):
            scores = (queries[:, start:start + rows] @ keys.transpose(-1, -2)) * plan.scale
            if plan.causal:  # query i of the request sees keys up to i + (KV length - query length)
                limit = torch.arange(start, start + scores.shape[1], device=where)[:, None] + (k1 - k0) - (q1 - q0)
                scores = scores.masked_fill(torch.arange(k1 - k0, device=where)[None, :] > limit, float("-inf"))
            peak = scores.amax(-1, keepdim=True)
            weights = (scores - peak).exp()
            total = weights.sum(-1, keepdim=True)
            outs.append(((weights / total) @ values).transpose(0, 1))
            peaks.append(peak[..., 0].transpose(0, 1))
            totals.append(total[..., 0].transpose(0, 1))
    return torch.cat(outs), torch.cat(peaks), torch.cat(totals)
