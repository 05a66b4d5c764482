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
without copying K/V), a boolean mask only for unequal lengths or a causal mask; rows with
softmax_lse run the explicit float32 softmax.  Reference: float64, one request at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels.mla_prefill import (
    KV_VALUES,
    RUNTIME_RULE,
    build_block_table,
    check_paged_lengths,
    distribute,
    explicit_attention,
    gather_blocks,
    lengths_from_cumulative,
    metadata_kv_lengths,
    packed_positions,
    packed_query_lengths,
    padded_index,
    request_attention,
    runtime_ints,
    visible_mask,
)
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

QUERY, KEY, VALUE, MASK, Q_LENS, KV_LENS, BLOCK_TABLE, Q_ROPE, K_ROPE = 0, 1, 2, 4, 5, 6, 14, 24, 25
_SLOT_NAMES = {QUERY: "query", KEY: "key", VALUE: "value", MASK: "atten_mask", Q_LENS: "actual_seq_lengths",
               KV_LENS: "actual_seq_lengths_kv", BLOCK_TABLE: "block_table", Q_ROPE: "query_rope",
               K_ROPE: "key_rope"}  # fmt: skip
MASK_SIDE = 2048  # sparse_mode 2/3/4 take this optimised causal mask
LAYOUT_COLUMN = "Runtime input_layout"


# ------------------------------------------------------------------ the row's plan
@dataclass(frozen=True)
class FiaPlan:
    layout: str  # query layout: TND, BSND, BNSD
    out_layout: str  # TND, NTD, BSND, BNSD, NBSD
    heads: int
    kv_heads: int
    head_dim: int  # without the rotary part
    rope_dim: int
    value_dim: int
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    block_size: int  # 0: contiguous KV
    cache_bnsd: bool  # paged cache [blocks, KV_N, block_size, D] rather than [blocks, block_size, KV_N*D]
    sparse_mode: int
    with_lse: bool
    pass_q_lens: bool
    pass_kv_lens: bool

    @property
    def batch(self) -> int:
        return len(self.q_lens)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim + self.rope_dim)

    @property
    def kv_span(self) -> int:
        """The padded KV length the portable path attends over (whole blocks when paged)."""
        longest = max(self.kv_lens)
        return math.ceil(longest / self.block_size) * self.block_size if self.block_size else longest

    @property
    def api_layout(self) -> str:
        return self.layout if self.out_layout == self.layout else f"{self.layout}_{self.out_layout}"


def _slot(row: KernelRow, index: int) -> TensorSpec | None:
    return row.inputs[index] if index < len(row.inputs) and row.inputs[index].present else None


def _shape(row: KernelRow, index: int) -> tuple[int, ...]:
    spec = _slot(row, index)
    if spec is None or spec.shape is None:
        raise CaseBuildError(f"{row.kernel_type} needs {_SLOT_NAMES[index]} in input slot {index}, which is empty")
    return spec.shape


def _layouts(row: KernelRow, q: tuple[int, ...], key: tuple[int, ...], paged: bool) -> tuple[str, bool]:
    named = row.attrs.get(LAYOUT_COLUMN, "").strip().upper().split("_")[0]
    if len(q) == 3:
        if _slot(row, Q_LENS) is None:
            raise CaseBuildError(f"{row.kernel_type}: 3-d query {shape_text(q)} without actual_seq_lengths is BSH, "
                                 "whose head count the shapes do not give")  # fmt: skip
        layout = "TND"
    elif len(q) == 4:
        if named in ("BSND", "BNSD"):
            layout = named
        elif paged:  # BSND takes only the [blocks, block_size, H] cache; a [B, N, 1, D] query is BNSD decode
            layout = "BNSD" if len(key) == 4 or (q[2] == 1 and q[1] != 1) else "BSND"
        else:  # vLLM-Ascend's contiguous prefill call is BSND
            layout = "BSND"
    else:
        raise CaseBuildError(f"{row.kernel_type}: query {shape_text(q)} is neither 3-d (TND) nor 4-d (BSND/BNSD)")
    if paged and (len(key) not in (3, 4) or (len(key) == 4 and layout == "BSND")):
        raise CaseBuildError(f"{row.kernel_type}: paged cache {shape_text(key)} does not fit a {layout} query")
    return layout, paged and len(key) == 4


def _heads(row: KernelRow, layout: str, q: tuple[int, ...], key: tuple[int, ...], value: tuple[int, ...],
           paged: bool, cache_bnsd: bool) -> tuple[int, int, int, int]:  # fmt: skip
    """(N, KV_N, D, value D) from the shapes."""
    heads, dim = (q[1], q[2]) if layout == "TND" else ((q[2], q[3]) if layout == "BSND" else (q[1], q[3]))
    if paged and not cache_bnsd:  # [blocks, block_size, KV_N * D]
        kv_heads = key[2] // dim if dim and key[2] % dim == 0 else 0
        k_dim, v_dim, same = dim, value[-1] // max(kv_heads, 1), key[:2] == value[:2]
    else:
        kv_axis = 1 if (paged or layout in ("TND", "BNSD")) else 2
        kv_heads, k_dim, v_dim = key[kv_axis], key[-1], value[-1]
        same = len(key) == len(value) and key[:-1] == value[:-1]
    if not (same and kv_heads and k_dim == dim and heads % kv_heads == 0):
        raise CaseBuildError(f"{row.kernel_type}: key {shape_text(key)} / value {shape_text(value)} do not fit "
                             f"query {shape_text(q)} as {layout} with {heads} heads of dim {dim}")  # fmt: skip
    return heads, kv_heads, dim, v_dim


def _query_lengths(row: KernelRow, layout: str, q: tuple[int, ...]) -> tuple[list[int], bool]:
    """Per-request query lengths and whether actual_seq_lengths is passed."""
    lens_slot = _slot(row, Q_LENS)
    if layout != "TND":
        batch, seq = q[0], q[1] if layout == "BSND" else q[2]
        if lens_slot is not None and lens_slot.numel not in (1, batch):
            raise CaseBuildError(f"{row.kernel_type}: actual_seq_lengths {shape_text(lens_slot)} for batch {batch}")
        return [seq] * batch, lens_slot is not None
    assert lens_slot is not None
    return packed_query_lengths(row, q[0], lens_slot.numel), True


def _kv_lengths(row: KernelRow, layout: str, block_size: int, key: tuple[int, ...], q_lens: list[int]) -> list[int]:
    batch = len(q_lens)
    if block_size:
        fallback = [max(block_size, n) for n in q_lens]  # one block per request (msmodeling)
        return metadata_kv_lengths(row, batch, fallback)
    if layout == "TND":
        values = runtime_ints(row, KV_VALUES)
        return lengths_from_cumulative(values, key[0], KV_VALUES) if values else distribute(key[0], batch)
    span = key[1] if layout == "BSND" else key[2]
    values = runtime_ints(row, KV_VALUES)
    if values is not None and (len(values) != batch or max(values) > span):
        raise CaseBuildError(f"{row.kernel_type}: {KV_VALUES} {values} does not fit {batch} requests of {span}")
    return values or [span] * batch


def _out_layout(row: KernelRow, layout: str, n: int, dv: int, q_lens: list[int]) -> str:
    out = row.outputs[0].shape if row.outputs and row.outputs[0].present else None
    b, s, t = len(q_lens), max(q_lens), sum(q_lens)
    shapes = {"TND": (t, n, dv), "NTD": (n, t, dv)} if layout == "TND" else {
        "BSND": (b, s, n, dv), "BNSD": (b, n, s, dv), "NBSD": (n, b, s, dv)}  # fmt: skip
    order = [layout, *[name for name in shapes if name != layout]]
    for name in order:
        if shapes[name] == out:
            return name
    raise CaseBuildError(f"{row.kernel_type}: attention_out {shape_text(out)} is none of "
                         + ", ".join(f"{k} {shape_text(v)}" for k, v in shapes.items()))  # fmt: skip


def _check_slots(row: KernelRow) -> None:
    for index, spec in enumerate(row.inputs):
        if spec.present and index not in _SLOT_NAMES:
            raise CaseBuildError(f"{row.kernel_type}: input slot {index} ({shape_text(spec)} {spec.dtype}) is an "
                                 "option not reproduced here (quantisation, pse, padding, prefix)")  # fmt: skip
    for index in (QUERY, KEY, VALUE, Q_ROPE, K_ROPE):
        floating = _slot(row, index)
        if floating is not None and (floating.dtype not in FLOATING or floating.dtype != row.inputs[QUERY].dtype):
            raise CaseBuildError(f"{row.kernel_type}: {_SLOT_NAMES[index]} dtype {floating.dtype} differs from the "
                                 f"floating query dtype {row.inputs[QUERY].dtype}")  # fmt: skip
    table = _slot(row, BLOCK_TABLE)
    if table is not None and (table.dtype != "INT32" or len(table.shape or ()) != 2):
        raise CaseBuildError(f"{row.kernel_type}: block_table {shape_text(table)} {table.dtype} is not 2-d INT32")
    mask = _slot(row, MASK)
    if mask is not None and (mask.shape not in ((2048, 2048), (1, 2048, 2048), (1, 1, 2048, 2048))
                             or mask.dtype not in ("INT8", "UINT8", "BOOL")):  # fmt: skip
        raise CaseBuildError(f"{row.kernel_type}: atten_mask {shape_text(mask)} {mask.dtype} is not the optimised "
                             f"causal mask [{MASK_SIDE},{MASK_SIDE}] (full masks are not replayed)")  # fmt: skip
    if (_slot(row, Q_ROPE) is None) != (_slot(row, K_ROPE) is None):
        raise CaseBuildError(f"{row.kernel_type}: query_rope and key_rope come together")


def fia_plan(row: KernelRow) -> FiaPlan:
    """Everything the row's call needs, derived from shapes and metadata (no tensors)."""
    _check_slots(row)
    q, key, value = _shape(row, QUERY), _shape(row, KEY), _shape(row, VALUE)
    table = _slot(row, BLOCK_TABLE)
    layout, cache_bnsd = _layouts(row, q, key, table is not None)
    heads, kv_heads, dim, v_dim = _heads(row, layout, q, key, value, table is not None, cache_bnsd)
    block_size = (key[2] if cache_bnsd else key[1]) if table is not None else 0
    q_lens, pass_q = _query_lengths(row, layout, q)
    kv_lens = _kv_lengths(row, layout, block_size, key, q_lens)
    sparse_mode = 3 if _slot(row, MASK) is not None else 0
    kv_slot = _slot(row, KV_LENS)
    if (layout == "TND" or table is not None) and (kv_slot is None or kv_slot.numel != len(q_lens)):
        raise CaseBuildError(f"{row.kernel_type}: actual_seq_lengths_kv {shape_text(kv_slot)} must give one length "
                             f"per request ({len(q_lens)})")  # fmt: skip
    if table is not None:
        assert table.shape is not None
        if table.shape[0] != len(q_lens):
            raise CaseBuildError(f"{row.kernel_type}: block_table {shape_text(table)} for {len(q_lens)} requests")
        check_paged_lengths(row, kv_lens, block_size, table, key[0])
    if sparse_mode == 3 and any(a > b for a, b in zip(q_lens, kv_lens)):
        raise CaseBuildError(f"{row.kernel_type}: causal mask with query lengths {q_lens} over KV lengths {kv_lens}")
    rope, k_rope = _slot(row, Q_ROPE), _slot(row, K_ROPE)
    rope_heads = kv_heads if table is not None and not cache_bnsd else 1  # [blocks, block_size, KV_N*R]
    if rope is not None and k_rope is not None and rope.shape and (
            rope.shape[:-1] != q[:-1] or k_rope.shape != (*key[:-1], rope.shape[-1] * rope_heads)):
        raise CaseBuildError(f"{row.kernel_type}: query_rope {shape_text(rope)} / key_rope {shape_text(k_rope)} do "
                             f"not extend query {shape_text(q)} / key {shape_text(key)}")  # fmt: skip
    lse = row.outputs[1] if len(row.outputs) > 1 and row.outputs[1].present else None
    out_layout = _out_layout(row, layout, heads, v_dim, q_lens)
    if lse is not None:
        expected = (sum(q_lens), heads, 1) if layout == "TND" else (len(q_lens), heads, max(q_lens), 1)
        if lse.shape != expected or lse.dtype not in ("FLOAT", "FLOAT32"):
            raise CaseBuildError(f"{row.kernel_type}: softmax_lse {shape_text(lse)} {lse.dtype}, expected "
                                 f"{shape_text(expected)} FLOAT")  # fmt: skip
    if row.outputs[0].dtype != row.inputs[QUERY].dtype:
        raise CaseBuildError(f"{row.kernel_type}: attention_out dtype {row.outputs[0].dtype} differs from the query's")
    return FiaPlan(layout, out_layout, heads, kv_heads, dim, rope.shape[-1] if rope and rope.shape else 0, v_dim,
                   tuple(q_lens), tuple(kv_lens), block_size, cache_bnsd, sparse_mode, lse is not None, pass_q,
                   kv_slot is not None)  # fmt: skip


# ------------------------------------------------------------------ the portable path
@dataclass(frozen=True)
class FiaCase:
    """The plan and the gathers/mask the portable path needs (built once, on the case's device)."""

    plan: FiaPlan
    q_index: "torch.Tensor | None"  # [B, S] token of each padded query position (TND, unequal lengths)
    out_index: "torch.Tensor | None"  # [T] padded position of each token
    kv_index: "torch.Tensor | None"  # [B, L] token of each padded KV position (contiguous TND, unequal)
    allowed: "torch.Tensor | None"  # [B, 1, G*S, L] True where a query may attend


def _fia_case(plan: FiaPlan, device: "torch.device") -> FiaCase:
    batch, seq, span = plan.batch, max(plan.q_lens), plan.kv_span
    q_index = out_index = kv_index = allowed = None
    if plan.layout == "TND" and len(set(plan.q_lens)) > 1:
        q_index, out_index = padded_index(plan.q_lens, seq, device), packed_positions(plan.q_lens, seq, device)
    if plan.layout == "TND" and not plan.block_size and len(set(plan.kv_lens)) > 1:
        kv_index = padded_index(plan.kv_lens, span, device)
    causal = plan.sparse_mode == 3 and seq > 1
    if causal or any(n < span for n in plan.kv_lens):
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
        ids = table[:, : plan.kv_span // plan.block_size].long()
        k = gather_blocks(key, ids, plan.kv_heads, plan.head_dim, plan.cache_bnsd)
        if key_rope is not None:
            k = torch.cat((k, gather_blocks(key_rope, ids, plan.kv_heads, plan.rope_dim, plan.cache_bnsd)), -1)
        return k, gather_blocks(value, ids, plan.kv_heads, plan.value_dim, plan.cache_bnsd)
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
    """[B, KV_N, G*S, Dv] (heads of a group folded into the sequence) -> the row's output layout."""
    plan = case.plan
    batch, seq, dv = plan.batch, max(plan.q_lens), out.shape[-1]
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
def _request_tensors(args: tuple[Any, ...], plan: FiaPlan, b: int) -> "tuple[torch.Tensor, torch.Tensor, torch.Tensor]":
    """Request ``b``'s query [S_b, N, D] and K, V [L_b, KV_N, D] in float64 on the CPU."""
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
    return q.to("cpu", torch.float64), k.to("cpu", torch.float64), v.to("cpu", torch.float64)


class FusedInferAttentionScoreReplay(OpReplay):
    kernel_types = ("FusedInferAttentionScore",)
    npu_api = "torch_npu.npu_fused_infer_attention_score"
    signature_rule = RUNTIME_RULE

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
        per_request = (request_attention(*_request_tensors(args, plan, b), plan.scale, causal)
                       for b in range(plan.batch))  # fmt: skip
        outs, lses = zip(*per_request)
        if plan.layout == "TND":
            out, lse = torch.cat(outs), torch.cat(lses).unsqueeze(-1)
            out = out.transpose(0, 1) if plan.out_layout == "NTD" else out
        else:
            out, lse = torch.stack(outs), torch.stack(lses).transpose(1, 2).unsqueeze(-1)  # [B, S, N, Dv], [B, N, S, 1]
            out = {"BSND": out, "BNSD": out.transpose(1, 2), "NBSD": out.permute(2, 0, 1, 3)}[plan.out_layout]
        return (out, lse) if plan.with_lse else out
