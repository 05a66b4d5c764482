"""``RINGMLAPrefillBF16Kernel`` replay (ATB ring MLA prefill), and the helpers the attention replays share.

No public row of this kernel type exists.  Its layout is the one msmodeling's
``RINGMLAPrefillBF16Kernel_run.py`` parses (15 input slots of the ATB RingMLA operation):

* 0 q_nope ``[T, N, 128]``, 1 q_rope ``[T, N, 64]``, 2 k_nope ``[S, KV_N, 128]``, 3 k_rope
  ``[S, KV_N, 64]``, 4 value ``[S, KV_N, 128]``, 5 mask ``[512, 512]`` (first ring step only),
  13 pre_out ``[T, N, 128]`` and 14 prev_lse ``[N, T]`` FLOAT (later ring steps only); slots 6-12
  (seqlen on the host, alibi slopes, quantisation scales) are not recorded.
* outputs: attention out ``[T, N, 128]`` and softmax_lse ``[N, T]`` FLOAT.

Two row families, as vLLM-Ascend's MLA prefill calls them: the first ring step
(``calc_type_first_ring``, ``mask_type_triu``: causal attention of the new tokens over themselves,
T == S) and a later step (``calc_type_default``, ``no_mask``: the new tokens over a context chunk,
merged with the previous step's output and log-sum-exp, ``lse = logaddexp(prev_lse, lse_chunk)``).
The split into requests is not recorded: one request, unless the row's ``avg_seq_len`` divides the
token counts evenly.  ``qk_scale = 1/sqrt(128 + 64)`` (msmodeling's choice).

NPU: ``torch_npu.atb.npu_ring_mla`` (op_mapping 0.13's note: "vllm-ascend: torch_npu.atb.npu_ring_mla()";
called as vLLM-Ascend's mla_v1.py does: ``seqlen`` an int32 host tensor ``[B]`` or ``[2, B]``,
``kernel_type_high_precision``, ``type_bsnd``, preallocated ``output`` and ``softmax_lse``).
Portable: the explicit float32 softmax (the row needs the log-sum-exp, which
``scaled_dot_product_attention`` does not return), chunked over query rows; reference: float64 per
request.

The shared helpers (KV lengths from runtime metadata, block tables, explicit attention, the float64
per-request attention) live here because this module imports no other replay module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from perf_plugin.database.signature import SignatureRule
from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

AVG_COLUMNS = ("Runtime avg_seq_len", "avg_seq_len")
Q_VALUES, KV_VALUES = "Runtime actual_seq_lengths_values", "Runtime actual_seq_lengths_kv_values"
# Rows of one shape with other runtime lengths are other workloads.
RUNTIME_RULE = SignatureRule(extra_columns=(*AVG_COLUMNS, Q_VALUES, KV_VALUES))
_SCORES_CHUNK = 1 << 25  # score elements per step of the explicit attention paths


# ------------------------------------------------------------------ helpers shared by the attention replays
def distribute(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal lengths, the first ones one longer."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def lengths_from_cumulative(values: Sequence[int], total: int, what: str) -> list[int]:
    """Per-request lengths from cumulative ones that must end at ``total``."""
    lengths = [b - a for a, b in zip([0, *values[:-1]], values)]
    if any(n < 0 for n in lengths) or values[-1] != total:
        raise CaseBuildError(f"{what} {list(values)} is not cumulative up to {total}")
    return lengths


def runtime_ints(row: KernelRow, column: str) -> list[int] | None:
    """A list column of the row's runtime metadata (``1,2,3``), or None when absent."""
    text = row.attrs.get(column, "").strip().strip('"')
    if not text:
        return None
    try:
        return [int(float(v)) for v in text.replace(";", ",").split(",") if v.strip()] or None
    except ValueError:
        raise CaseBuildError(f"{row.kernel_type}: column {column!r} is not a list of integers: {text!r}") from None


def average_kv_len(row: KernelRow) -> float | None:
    """The recorded mean KV length; None when absent or not positive (-1 means unknown)."""
    for column in AVG_COLUMNS:
        text = row.attrs.get(column, "").strip()
        if text:
            try:
                value = float(text)
            except ValueError:
                raise CaseBuildError(f"{row.kernel_type}: column {column!r} is not a number: {text!r}") from None
            return value if value > 0 else None
    return None


def metadata_kv_lengths(row: KernelRow, batch: int, fallback: Sequence[int]) -> list[int]:
    """Per-request KV lengths: the runtime values, else the mean spread evenly, else ``fallback``."""
    values = runtime_ints(row, KV_VALUES)
    if values is not None:
        if len(values) != batch:
            raise CaseBuildError(f"{row.kernel_type}: {KV_VALUES} has {len(values)} values for {batch} requests")
        return values
    avg = average_kv_len(row)
    return distribute(round(avg * batch), batch) if avg is not None else list(fallback)


def packed_query_lengths(row: KernelRow, tokens: int, batch: int) -> list[int]:
    """Per-request lengths of ``tokens`` packed query tokens: the runtime cumulative values, else an even split."""
    values = runtime_ints(row, Q_VALUES)
    if values is not None and len(values) != batch:
        raise CaseBuildError(f"{row.kernel_type}: {Q_VALUES} has {len(values)} values for {batch} requests")
    if values is not None:
        return lengths_from_cumulative(values, tokens, Q_VALUES)
    if batch < 1 or tokens < batch:
        raise CaseBuildError(f"{row.kernel_type}: {tokens} query tokens cannot make {batch} requests")
    return distribute(tokens, batch)


def check_paged_lengths(row: KernelRow, kv_lens: Sequence[int], block_size: int, table: TensorSpec, pool: int) -> None:
    """Every request's blocks fit its block-table row and, distinct, the pool."""
    width = (table.shape or (0,))[-1]
    for b, n in enumerate(kv_lens):
        blocks = math.ceil(n / block_size)
        if n < 1 or blocks > width or blocks > pool:
            raise CaseBuildError(
                f"{row.kernel_type}: request {b} KV length {n} needs {blocks} blocks of {block_size}; the block "
                f"table {shape_text(table)} allows {width} per request and the cache holds {pool}"
            )


def build_block_table(
    kv_lens: Sequence[int], block_size: int, pool: int, shape: Sequence[int], device: "torch.device",
    generator: "torch.Generator | None",
) -> "torch.Tensor":  # fmt: skip
    """INT32 block ids: request b's blocks follow a random permutation of the pool from where request
    b-1 stopped (wrapping), so every entry is a valid id and a request's blocks are distinct."""
    import torch

    blocks = [math.ceil(n / block_size) for n in kv_lens]
    starts = torch.tensor([0, *accumulate(blocks)][: len(blocks)], dtype=torch.int64, device=device)
    perm = torch.randperm(pool, generator=generator, device=device)
    positions = (starts[:, None] + torch.arange(shape[1], device=device)) % pool
    return perm[positions].to(torch.int32)


def padded_index(lengths: Sequence[int], span: int, device: "torch.device") -> "torch.Tensor":
    """[B, span] token indices of packed requests, padding positions repeating a request's last token."""
    import torch

    starts = [0, *accumulate(lengths)]
    rows = [[starts[b] + min(i, n - 1) for i in range(span)] for b, n in enumerate(lengths)]
    return torch.tensor(rows, dtype=torch.int64, device=device)


def packed_positions(lengths: Sequence[int], span: int, device: "torch.device") -> "torch.Tensor":
    """[sum(lengths)]: where each token of packed requests sits in a [B, span] padded layout."""
    import torch

    rows = [b * span + i for b, n in enumerate(lengths) for i in range(n)]
    return torch.tensor(rows, dtype=torch.int64, device=device)


def visible_mask(q_lens: Sequence[int], kv_lens: Sequence[int], span: int, causal: bool,
                 device: "torch.device") -> "torch.Tensor":  # fmt: skip
    """[B, S, span]: KV position j is visible to padded query row i of request b when j < kv_b and,
    causal (rightDownCausal: the queries are the last q_b positions), j <= kv_b - q_b + i."""
    import torch

    kv = torch.tensor(kv_lens, device=device)[:, None, None]
    limit = kv - 1
    if causal:
        rows = torch.arange(max(q_lens), device=device)[None, :, None]
        limit = torch.minimum(limit, kv - torch.tensor(q_lens, device=device)[:, None, None] + rows)
    return torch.arange(span, device=device)[None, None, :] <= limit


def gather_blocks(
    cache: "torch.Tensor", ids: "torch.Tensor", kv_heads: int, dim: int, heads_first: bool = False
) -> "torch.Tensor":
    """[B, nb * block_size, KV_N, dim]: the blocks ``ids`` [B, nb] of a paged cache, in order.  The cache is
    [blocks, block_size, KV_N*dim], [blocks, block_size, KV_N, dim] or, heads first, [blocks, KV_N, block_size, dim]."""
    blocks = cache[ids]
    if heads_first:
        blocks = blocks.transpose(2, 3)
    return blocks.reshape(ids.shape[0], -1, kv_heads, dim)


def explicit_attention(
    q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", allowed: "torch.Tensor | None", scale: float
) -> "tuple[torch.Tensor, torch.Tensor]":
    """``softmax(q k^T scale) v`` and the natural-log sum-exp of the scores, accumulated in float32
    (float64 for float64 inputs), over query chunks that keep the scores below 2^25 elements."""
    import torch

    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    rows = max(1, _SCORES_CHUNK // max(1, q[..., 0].numel() // q.shape[-2] * k.shape[-2]))
    keys, values = k.to(acc).transpose(-1, -2), v.to(acc)
    outs, lses = [], []
    for start in range(0, q.shape[-2], rows):
        scores = torch.matmul(q[..., start : start + rows, :].to(acc), keys).mul_(scale)
        if allowed is not None:
            scores.masked_fill_(~allowed[..., start : start + rows, :], -math.inf)
        lse = torch.logsumexp(scores, -1)
        outs.append(torch.matmul(scores.sub_(lse.unsqueeze(-1)).exp_(), values))
        lses.append(lse)
    return torch.cat(outs, -2), torch.cat(lses, -1)


def request_attention(
    q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", scale: float, causal: bool
) -> "tuple[torch.Tensor, torch.Tensor]":
    """One request in float64: q [S, N, D], k [L, KV_N, D], v [L, KV_N, Dv] -> out [S, N, Dv] and
    lse [S, N]; query head h uses KV head h // (N / KV_N); causal aligns the queries to the KV end."""
    import torch

    seq, n, kv_heads = q.shape[0], k.shape[0], k.shape[1]
    grouped = q.double().reshape(seq, kv_heads, -1, q.shape[-1])
    k, v = k.double(), v.double()
    rows = max(1, _SCORES_CHUNK // max(1, q.shape[1] * n))
    outs, lses = [], []
    for start in range(0, seq, rows):
        scores = torch.einsum("shgd,lhd->hgsl", grouped[start : start + rows], k) * scale
        if causal:  # query i of the last ``seq`` positions sees KV positions up to n - seq + i
            limit = n - seq + torch.arange(start, start + scores.shape[2], device=scores.device)[:, None]
            scores = scores.masked_fill(torch.arange(n, device=scores.device)[None, :] > limit, -math.inf)
        lse = torch.logsumexp(scores, -1)
        outs.append(torch.einsum("hgsl,lhd->shgd", torch.exp(scores - lse[..., None]), v).flatten(1, 2))
        lses.append(lse.permute(2, 0, 1).flatten(1))
    return torch.cat(outs), torch.cat(lses)


# ------------------------------------------------------------------ RINGMLAPrefillBF16Kernel
Q_NOPE, Q_ROPE, K_NOPE, K_ROPE, VALUE, MASK, PRE_OUT, PREV_LSE = 0, 1, 2, 3, 4, 5, 13, 14
_RING_SLOTS = {Q_NOPE: "q_nope", Q_ROPE: "q_rope", K_NOPE: "k_nope", K_ROPE: "k_rope", VALUE: "value",
               MASK: "mask", PRE_OUT: "pre_out", PREV_LSE: "prev_lse"}  # fmt: skip
RING_MASK_SIDE = 512  # the ATB ring MLA mask is [512, 512]


@dataclass(frozen=True)
class RingPlan:
    heads: int
    kv_heads: int
    nope_dim: int
    rope_dim: int
    value_dim: int
    batch: int
    q_len: int  # per request
    kv_len: int
    first_ring: bool  # calc_type_first_ring + causal mask; else calc_type_default, merging pre_out/prev_lse
    with_lse: bool

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.nope_dim + self.rope_dim)


def _ring_spec(row: KernelRow, index: int) -> TensorSpec | None:
    return row.inputs[index] if index < len(row.inputs) and row.inputs[index].present else None


def ring_plan(row: KernelRow) -> RingPlan:
    for index, spec in enumerate(row.inputs):
        if spec.present and index not in _RING_SLOTS:
            raise CaseBuildError(f"{row.kernel_type}: input slot {index} ({shape_text(spec)} {spec.dtype}) is not "
                                 "replayed (alibi slopes or quantisation scales)")  # fmt: skip
    specs = [_ring_spec(row, i) for i in (Q_NOPE, Q_ROPE, K_NOPE, K_ROPE, VALUE)]
    shapes = [s.shape if s is not None and s.shape is not None and len(s.shape) == 3 else None for s in specs]
    qn, qr, kn, kr, v = shapes
    if qn is None or qr is None or kn is None or kr is None or v is None:
        raise CaseBuildError(f"{row.kernel_type} needs 3-d q_nope;q_rope;k_nope;k_rope;value in slots 0-4, got "
                             + ";".join(shape_text(s) for s in row.inputs[:5]))  # fmt: skip
    tokens, heads, kv_tokens, kv_heads = qn[0], qn[1], kn[0], kn[1]
    fits = qr[:2] == qn[:2] and kr[:2] == kn[:2] and v[:2] == kn[:2] and kn[2] == qn[2] and kr[2] == qr[2]
    if not fits or heads % kv_heads:
        raise CaseBuildError(f"{row.kernel_type}: q {shape_text(qn)}+{shape_text(qr)}, k {shape_text(kn)}+"
                             f"{shape_text(kr)}, v {shape_text(v)} are not one MLA attention")  # fmt: skip
    dtype = row.inputs[Q_NOPE].dtype
    if dtype not in FLOATING or any(s is None or s.dtype != dtype for s in specs):
        raise CaseBuildError(f"{row.kernel_type}: q/k/v dtypes must be one floating type, got "
                             + ";".join(s.dtype for s in row.inputs[:5]))  # fmt: skip
    pre_out, prev_lse = _ring_spec(row, PRE_OUT), _ring_spec(row, PREV_LSE)
    first_ring = pre_out is None and prev_lse is None
    if not first_ring and (pre_out is None or prev_lse is None or pre_out.shape != (tokens, heads, v[2])
                           or prev_lse.shape != (heads, tokens) or prev_lse.dtype not in ("FLOAT", "FLOAT32")):
        raise CaseBuildError(f"{row.kernel_type}: pre_out {shape_text(pre_out)} and prev_lse {shape_text(prev_lse)} "
                             f"must be [{tokens},{heads},{v[2]}] and [{heads},{tokens}] FLOAT together")  # fmt: skip
    if first_ring and tokens != kv_tokens:
        raise CaseBuildError(f"{row.kernel_type}: the first (causal) ring step attends {tokens} tokens over "
                             f"themselves, but k has {kv_tokens}")  # fmt: skip
    outputs = row.present_outputs
    if not outputs or outputs[0].shape != (tokens, heads, v[2]) or outputs[0].dtype != dtype:
        raise CaseBuildError(f"{row.kernel_type}: output {shape_text(outputs[0] if outputs else None)} should be "
                             f"[{tokens},{heads},{v[2]}] {dtype}")  # fmt: skip
    if len(outputs) > 1 and (outputs[1].shape != (heads, tokens) or outputs[1].dtype not in ("FLOAT", "FLOAT32")):
        raise CaseBuildError(f"{row.kernel_type}: softmax_lse {shape_text(outputs[1])} should be "
                             f"[{heads},{tokens}] FLOAT")  # fmt: skip
    avg = average_kv_len(row)  # requests of avg tokens each, where that splits both sides evenly
    batch = int(tokens / avg) if avg and (tokens / avg).is_integer() else 1
    if kv_tokens % batch:
        batch = 1  # the split is not recorded: one request
    return RingPlan(heads, kv_heads, qn[2], qr[2], v[2], batch, tokens // batch, kv_tokens // batch, first_ring,
                    len(outputs) > 1)  # fmt: skip


class RingMlaPrefillReplay(OpReplay):
    kernel_types = ("RINGMLAPrefillBF16Kernel",)
    npu_api = "torch_npu.atb.npu_ring_mla"

    def check(self, row: KernelRow) -> None:
        ring_plan(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        plan = ring_plan(row)
        q_nope, q_rope, k_nope, k_rope, value = (self.random(row.inputs[i], device, generator) for i in range(5))
        mask_spec = _ring_spec(row, MASK)
        mask_dtype = mask_spec.torch_dtype() if mask_spec is not None else q_nope.dtype
        side = mask_spec.shape[-1] if mask_spec is not None and mask_spec.shape else RING_MASK_SIDE
        # vLLM-Ascend's prefill mask: 1 above the diagonal (-inf for float16); the API takes it even with no_mask
        upper = torch.ones(side, side, dtype=torch.bool, device=device).triu_(1)
        fill = -math.inf if mask_dtype == torch.float16 else 1
        mask = torch.zeros(side, side, dtype=mask_dtype, device=device).masked_fill_(upper, fill)
        q_lens, kv_lens = [plan.q_len] * plan.batch, [plan.kv_len] * plan.batch
        seqlen = torch.tensor(q_lens if plan.first_ring else [q_lens, kv_lens], dtype=torch.int32)  # on the host
        pre_out = prev_lse = None
        if not plan.first_ring:
            pre_out, prev_lse = (self.random(row.inputs[i], device, generator) for i in (PRE_OUT, PREV_LSE))
        tokens = plan.batch * plan.q_len
        output = torch.empty(tokens, plan.heads, plan.value_dim, dtype=q_nope.dtype, device=device)
        lse = torch.empty(plan.heads, tokens, dtype=torch.float32, device=device)
        causal = None
        if plan.first_ring:  # [G*S, S]: the G query heads of a KV head share the causal pattern
            tril = torch.ones(plan.q_len, plan.kv_len, dtype=torch.bool, device=device).tril_()
            causal = tril.repeat(plan.heads // plan.kv_heads, 1)
        return q_nope, q_rope, k_nope, k_rope, value, mask, seqlen, pre_out, prev_lse, output, lse, (plan, causal)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        q_nope, q_rope, k_nope, k_rope, value, mask, seqlen, pre_out, prev_lse, output, lse, (plan, _) = args
        return self.api_call(
            q_nope, q_rope, k_nope, k_rope, value, mask, seqlen,
            head_num=plan.heads, kv_head_num=plan.kv_heads, pre_out=pre_out, prev_lse=prev_lse,
            qk_scale=plan.scale, kernel_type="kernel_type_high_precision",
            mask_type="mask_type_triu" if plan.first_ring else "no_mask", input_layout="type_bsnd",
            calc_type="calc_type_first_ring" if plan.first_ring else "calc_type_default",
            output=output, softmax_lse=lse, select=(0, 1) if plan.with_lse else (0,),
        )  # fmt: skip

    def run(self, q_nope: "torch.Tensor", q_rope: "torch.Tensor", k_nope: "torch.Tensor", k_rope: "torch.Tensor",
            value: "torch.Tensor", *rest: Any) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":  # fmt: skip
        import torch

        _, _, pre_out, prev_lse, _, _, (plan, causal) = rest
        batch, heads, group = plan.batch, plan.heads, plan.heads // plan.kv_heads
        q = torch.cat((q_nope, q_rope), -1)
        q = q.view(batch, plan.q_len, plan.kv_heads, group, -1).permute(0, 2, 3, 1, 4).flatten(2, 3)
        k = torch.cat((k_nope, k_rope), -1).view(batch, plan.kv_len, plan.kv_heads, -1).transpose(1, 2)
        v = value.view(batch, plan.kv_len, plan.kv_heads, -1).transpose(1, 2)
        out, lse = explicit_attention(q, k, v, causal, plan.scale)  # [B, KV_N, G*S, Dv], [B, KV_N, G*S]
        if not plan.first_ring:  # merge with the previous ring step
            prev = prev_lse.view(plan.kv_heads, group, batch, plan.q_len).permute(2, 0, 1, 3).flatten(2, 3)
            before = pre_out.view(batch, plan.q_len, plan.kv_heads, group, -1).permute(0, 2, 3, 1, 4).flatten(2, 3)
            merged = torch.logaddexp(prev.to(lse.dtype), lse)
            out = before.to(out.dtype) * (prev - merged).exp_()[..., None] + out * (lse - merged).exp_()[..., None]
            lse = merged
        out = out.view(batch, plan.kv_heads, group, plan.q_len, -1).permute(0, 3, 1, 2, 4)
        out = out.reshape(-1, heads, out.shape[-1]).to(q_nope.dtype)
        if not plan.with_lse:
            return out
        return out, lse.view(batch, heads, plan.q_len).transpose(0, 1).reshape(heads, -1).to(torch.float32)

    def reference(self, *args: Any) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
        import torch

        q_nope, q_rope, k_nope, k_rope, value, _, _, pre_out, prev_lse, _, _, (plan, _) = args
        q = torch.cat((q_nope, q_rope), -1).to("cpu", torch.float64)
        k = torch.cat((k_nope, k_rope), -1).to("cpu", torch.float64)
        v = value.to("cpu", torch.float64)
        outs, lses = [], []
        for b in range(plan.batch):
            qs, ks = slice(b * plan.q_len, (b + 1) * plan.q_len), slice(b * plan.kv_len, (b + 1) * plan.kv_len)
            out, lse = request_attention(q[qs], k[ks], v[ks], plan.scale, plan.first_ring)
            outs.append(out)
            lses.append(lse)
        out, lse = torch.cat(outs), torch.cat(lses)  # [T, N, Dv], [T, N]
        if not plan.first_ring:
            prev, before = prev_lse.to("cpu", torch.float64).T, pre_out.to("cpu", torch.float64)
            merged = torch.logaddexp(prev, lse)
            out = before * torch.exp(prev - merged)[..., None] + out * torch.exp(lse - merged)[..., None]
            lse = merged
        return (out, lse.T) if plan.with_lse else out
