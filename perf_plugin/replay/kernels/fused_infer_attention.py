"""``FusedInferAttentionScore`` replay: inference attention over a contiguous or paged KV cache.

Row layout: 31 input slots in the ``aclnnFusedInferAttentionScore`` order (the real rows of
``db_row_FusedInferAttentionScore.csv``, msmodeling's ``FusedInferAttentionScore_run.py``, the
``torch_npu.npu_fused_infer_attention_score`` docs): 0 query, 1 key, 2 value, 4 atten_mask,
5 actual_seq_lengths, 6 actual_seq_lengths_kv, 14 block_table, 24 query_rope, 25 key_rope; rows using
any other slot (pse, quantisation, antiquant, padding, shared prefix) are refused.  Outputs:
attention_out, and softmax_lse (FLOAT) when asked for (an empty slot in every real row).

Layouts, from the shapes (or ``Runtime input_layout``): ``TND`` query ``[T, N, D]`` with cumulative
actual_seq_lengths; paged KV (block_table present) is a cache ``[blocks, block_size, KV_N*D]`` or
``[blocks, KV_N, block_size, D]`` with per-request actual_seq_lengths_kv (vLLM-Ascend passes
``actual_seq_lengths_q`` and ``seq_lens_list``), contiguous KV ``[T_kv, KV_N, D]`` with cumulative
lengths.  ``BSND`` / ``BNSD`` query ``[B, S, N, D]`` / ``[B, N, S, D]``.  A ``_``-suffixed layout
writes the output in another one, e.g. the MLA decode rows ``BNSD_NBSD`` (query ``[B, N, 1, 512]`` +
query_rope, latent cache ``[blocks, 1, 128, 512]`` + key_rope, output ``[N, B, 1, 512]``).

Head counts come from the shapes (KV_N = cache H / head dim).  KV lengths come from
``Runtime actual_seq_lengths_kv_values``, else the mean KV length (``Runtime avg_seq_len`` or the
older ``avg_seq_len``: mean(actual_seq_lengths_kv) per ``fill_fia_runtime_metadata.py``, -1 unknown)
spread evenly, else one block per request (msmodeling's fallback); contiguous TND rows split their
tokens evenly.  Each request gets ``ceil(len / block_size)`` distinct blocks of a random permutation
of the pool, wrapping round when the requests together need more than the pool (a real row asks
496 x 32 of 12307 blocks): ids stay valid and the kernel reads what it would.  A mask slot
(``[2048, 2048]`` INT8) means sparse_mode 3 (rightDownCausal); no mask, sparse_mode 0.

NPU: ``torch_npu.npu_fused_infer_attention_score`` (op_mapping's microbench_api) with int-list
lengths, ``num_heads``, ``num_key_value_heads``, ``scale = 1/sqrt(D + rope D)``, ``input_layout``,
``sparse_mode``, ``block_size``, ``softmax_lse_flag``.  Portable: one gather of the KV blocks, then
``scaled_dot_product_attention`` with the query heads of a KV group folded into the query rows (GQA
without copying K/V), a boolean mask only for unequal lengths or a causal mask (a paged cache's
blocks gathered whole and cut to the longest request); causal self-attention of equal lengths
(a prefill) takes the fused causal kernel with the heads unfolded and no mask; rows with
softmax_lse run the explicit float32 softmax.  Reference: float64, one request at a time.
"""

from __future__ import annotations

import math
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import OpReplay
from perf_plugin.replay.kernels.mla_prefill import (
    RUNTIME_RULE,
    build_block_table,
    explicit_attention,
    gather_blocks,
    packed_positions,
    padded_index,
    request_attention,
    visible_mask,
)
from perf_plugin.replay.tensors import KernelRow

if TYPE_CHECKING:
    import torch

from perf_plugin.replay.kernels._fia_plan import (
    BLOCK_TABLE,
    K_ROPE,
    KEY,
    MASK,
    Q_ROPE,
    QUERY,
    VALUE,
    FiaCase,
    FiaPlan,
    fia_plan,
)


def _fia_case(plan: FiaPlan, device: "torch.device") -> FiaCase:
    batch, seq, span = plan.batch, max(plan.q_lens), plan.kv_span
    q_index = out_index = kv_index = allowed = None
    if plan.layout == "TND" and len(set(plan.q_lens)) > 1:
        q_index, out_index = padded_index(plan.q_lens, seq, device), packed_positions(plan.q_lens, seq, device)
    if plan.layout == "TND" and not plan.block_size and len(set(plan.kv_lens)) > 1:
        kv_index = padded_index(plan.kv_lens, span, device)
    kernel = plan.portable_kernel
    if kernel == "causal":
        # every request attends causally over its own tokens: top-left causal is rightDownCausal
        return FiaCase(plan, q_index, out_index, kv_index, None, is_causal=True)
    if kernel == "masked":
        causal = plan.sparse_mode == 3 and seq > 1
        mask = visible_mask(plan.q_lens, plan.kv_lens, span, causal, device)  # [B, S, L]
        group = plan.heads // plan.kv_heads  # the G heads of a KV head share it
        allowed = mask[:, None].expand(batch, group, seq, span).reshape(batch, 1, group * seq, span)
    return FiaCase(plan, q_index, out_index, kv_index, allowed)


def _kv_batches(key: "torch.Tensor", value: "torch.Tensor", key_rope: "torch.Tensor | None",
                table: "torch.Tensor | None", case: FiaCase) -> "tuple[torch.Tensor, torch.Tensor]":  # fmt: skip
    """K (rotary part appended) and V as [B, L, KV_N, dim]."""
    import torch

    plan = case.plan
    if table is not None:
        ids, span = table[:, : plan.kv_blocks].long(), plan.kv_span
        k = gather_blocks(key, ids, plan.kv_heads, plan.head_dim, plan.cache_bnsd)
        if key_rope is not None:
            k = torch.cat((k, gather_blocks(key_rope, ids, plan.kv_heads, plan.rope_dim, plan.cache_bnsd)), -1)
        return k[:, :span], gather_blocks(value, ids, plan.kv_heads, plan.value_dim, plan.cache_bnsd)[:, :span]
    if key_rope is not None:
        key = torch.cat((key, key_rope), -1)
    if plan.layout == "TND":
        if case.kv_index is not None:
            return key[case.kv_index], value[case.kv_index]
        return key.view(plan.batch, plan.kv_span, *key.shape[1:]), value.view(plan.batch, -1, *value.shape[1:])
    if plan.layout == "BNSD":
        return key.transpose(1, 2), value.transpose(1, 2)
    return key, value


def _query_batches(query: "torch.Tensor", case: FiaCase) -> "torch.Tensor":
    """The query as [B, S, N, D] (TND padded per request)."""
    plan = case.plan
    if plan.layout == "TND":
        if case.q_index is not None:
            return query[case.q_index]
        return query.view(plan.batch, plan.q_lens[0], *query.shape[1:])
    return query.transpose(1, 2) if plan.layout == "BNSD" else query


def _out_layout_of(out: "torch.Tensor", case: FiaCase) -> "torch.Tensor":
    """[B, KV_N, G*S, Dv] (heads of a group folded into the sequence) or, causal, [B, N, S, Dv] ->
    the row's output layout (reshape copies only where the layouts differ in memory)."""
    plan = case.plan
    batch, seq, dv = plan.batch, max(plan.q_lens), out.shape[-1]
    # splitting one dimension is a view whatever the others' strides (the causal kernel's output
    # lies [B, S, N, Dv] in memory)
    grouped = out.view(batch, plan.kv_heads, plan.heads // plan.kv_heads, seq, dv)
    if plan.out_layout == "BNSD":
        return grouped.reshape(batch, plan.heads, seq, dv)
    if plan.out_layout == "NBSD":
        return grouped.permute(1, 2, 0, 3, 4).reshape(plan.heads, batch, seq, dv)
    bsnd = grouped.permute(0, 3, 1, 2, 4).reshape(batch, seq, plan.heads, dv)
    if plan.out_layout == "BSND":
        return bsnd
    tnd = bsnd.reshape(batch * seq, plan.heads, dv)
    tnd = tnd if case.out_index is None else tnd[case.out_index]
    return tnd.transpose(0, 1).contiguous() if plan.out_layout == "NTD" else tnd


def _lse_layout_of(lse: "torch.Tensor", case: FiaCase) -> "torch.Tensor":
    """[B, KV_N, G*S] -> [T, N, 1] (TND) or [B, N, S, 1]."""
    plan = case.plan
    per_head = lse.reshape(plan.batch, plan.heads, max(plan.q_lens))
    if plan.layout != "TND":
        return per_head.unsqueeze(-1)
    tokens = per_head.transpose(1, 2).reshape(-1, plan.heads)
    return (tokens if case.out_index is None else tokens[case.out_index]).unsqueeze(-1)


# ------------------------------------------------------------------ the float64 reference
def _request_tensors(args: tuple[Any, ...], plan: FiaPlan, b: int,
                     where: "torch.device | str" = "cpu") -> "tuple[torch.Tensor, torch.Tensor, torch.Tensor]":
    """Request ``b``'s query [S_b, N, D] and K, V [L_b, KV_N, D] in float64 on ``where``."""
    import torch

    query, key, value, _, table, query_rope, key_rope, _ = args
    query = query if query_rope is None else torch.cat((query, query_rope), -1)
    q_start, kv_start, n = sum(plan.q_lens[:b]), sum(plan.kv_lens[:b]), plan.kv_lens[b]
    if plan.layout == "TND":
        q = query[q_start : q_start + plan.q_lens[b]]
    else:
        q = query[b] if plan.layout == "BSND" else query[b].transpose(0, 1)
    if table is not None:
        ids = table[b : b + 1, : math.ceil(n / plan.block_size)].long()
        k, v = (gather_blocks(c, ids, plan.kv_heads, d, plan.cache_bnsd)[0, :n]
                for c, d in ((key, plan.head_dim), (value, plan.value_dim)))  # fmt: skip
        if key_rope is not None:
            k = torch.cat((k, gather_blocks(key_rope, ids, plan.kv_heads, plan.rope_dim, plan.cache_bnsd)[0, :n]), -1)
    else:
        key = key if key_rope is None else torch.cat((key, key_rope), -1)
        if plan.layout == "TND":
            k, v = key[kv_start : kv_start + n], value[kv_start : kv_start + n]
        else:
            heads_first = plan.layout == "BNSD"
            k, v = ((t[b, :, :n].transpose(0, 1) if heads_first else t[b, :n]) for t in (key, value))
    return q.to(where, torch.float64), k.to(where, torch.float64), v.to(where, torch.float64)


class FusedInferAttentionScoreReplay(OpReplay):
    kernel_types = ("FusedInferAttentionScore",)
    npu_api = "torch_npu.npu_fused_infer_attention_score"
    signature_rule = RUNTIME_RULE
    # a prefill's float64 attention takes minutes on a host; on CUDA, seconds
    reference_on_device = True

    def check(self, row: KernelRow) -> None:
        fia_plan(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        plan = fia_plan(row)
        q, k, v = (self.random(row.inputs[i], device, generator) for i in (QUERY, KEY, VALUE))
        q_rope, k_rope = (self.random(row.inputs[i], device, generator) if plan.rope_dim else None
                          for i in (Q_ROPE, K_ROPE))  # fmt: skip
        mask = None
        if plan.sparse_mode:  # 1 above the diagonal: the positions a query may not see
            spec = row.inputs[MASK]
            assert spec.shape is not None
            mask = torch.ones(spec.shape, dtype=torch.bool, device=device).triu_(1).to(spec.torch_dtype())
        table = None
        if plan.block_size:
            spec = row.inputs[BLOCK_TABLE]
            assert spec.shape is not None
            table = build_block_table(plan.kv_lens, plan.block_size, k.shape[0], spec.shape, device, generator)
        return q, k, v, mask, table, q_rope, k_rope, _fia_case(plan, device)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        query, key, value, mask, table, q_rope, k_rope, case = args
        plan: FiaPlan = case.plan
        kwargs: dict[str, Any] = {}
        if mask is not None:
            kwargs["atten_mask"] = mask
        if plan.pass_q_lens:  # TND: cumulative query lengths
            kwargs["actual_seq_lengths"] = list(accumulate(plan.q_lens)) if plan.layout == "TND" else list(plan.q_lens)
        if plan.pass_kv_lens:  # cumulative only for contiguous TND KV; per request when paged
            cumulative = plan.layout == "TND" and not plan.block_size
            kwargs["actual_seq_lengths_kv"] = list(accumulate(plan.kv_lens)) if cumulative else list(plan.kv_lens)
        if table is not None:
            kwargs.update(block_table=table, block_size=plan.block_size)
        if q_rope is not None:
            kwargs.update(query_rope=q_rope, key_rope=k_rope)
        kwargs.update(num_heads=plan.heads, scale=plan.scale, input_layout=plan.api_layout,
                      num_key_value_heads=plan.kv_heads, sparse_mode=plan.sparse_mode,
                      softmax_lse_flag=plan.with_lse)  # fmt: skip
        return self.api_call(query, key, value, select=(0, 1) if plan.with_lse else (0,), **kwargs)

    def run(self, query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor", mask: "torch.Tensor | None",
            table: "torch.Tensor | None", query_rope: "torch.Tensor | None", key_rope: "torch.Tensor | None",
            case: FiaCase) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":  # fmt: skip
        import torch
        import torch.nn.functional as F

        plan = case.plan
        if query_rope is not None:
            query = torch.cat((query, query_rope), -1)
        q = _query_batches(query, case)  # [B, S, N, D]
        batch, seq, _, dim = q.shape
        if case.is_causal:  # the fused causal kernel (flash attention where the device has it)
            k, v = (t.transpose(1, 2) for t in _kv_batches(key, value, key_rope, table, case))
            gqa = plan.heads != plan.kv_heads
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, scale=plan.scale,
                                                 enable_gqa=gqa)  # fmt: skip
            return _out_layout_of(out, case)
        # the G query heads sharing a KV head become G*S query rows of that head: GQA without repeating K/V
        q = q.view(batch, seq, plan.kv_heads, -1, dim).permute(0, 2, 3, 1, 4).reshape(batch, plan.kv_heads, -1, dim)
        k, v = _kv_batches(key, value, key_rope, table, case)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if plan.with_lse:
            out, lse = explicit_attention(q, k, v, case.allowed, plan.scale)
            return _out_layout_of(out.to(v.dtype), case), _lse_layout_of(lse, case)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=case.allowed, scale=plan.scale)
        return _out_layout_of(out, case)

    def reference(self, *args: Any) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
        import torch

        plan: FiaPlan = args[-1].plan
        causal = plan.sparse_mode == 3
        where = self.reference_device(args[:3])
        per_request = (request_attention(*_request_tensors(args, plan, b, where), plan.scale, causal)
                       for b in range(plan.batch))  # fmt: skip
        outs, lses = zip(*per_request)
        if plan.layout == "TND":
            out, lse = torch.cat(outs), torch.cat(lses).unsqueeze(-1)
            out = out.transpose(0, 1) if plan.out_layout == "NTD" else out
        else:
            out, lse = torch.stack(outs), torch.stack(lses).transpose(1, 2).unsqueeze(-1)  # [B, S, N, Dv], [B, N, S, 1]
            out = {"BSND": out, "BNSD": out.transpose(1, 2), "NBSD": out.permute(2, 0, 1, 3)}[plan.out_layout]
        return (out, lse) if plan.with_lse else out
