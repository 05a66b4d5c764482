"""DeepSeek sparse attention (DSA) replays: ``LightningIndexer`` picks the top-k KV positions of each
query token, ``SparseFlashAttention`` attends over exactly those positions of a paged latent cache.

No public row of either kernel type exists; the layouts are the ones msmodeling's replay scripts
parse (``LightningIndexer_run.py``, ``SparseFlashAttention_run.py``), which follow the APIs:

* ``LightningIndexer`` (6 inputs): 0 query ``[T, N1, D]`` (TND) or ``[B, S, N1, D]`` (BSND),
  1 key, the indexer cache ``[blocks, block_size, KV_N, D]`` (PA_BSND), 2 weights (query shape
  without D), 3 actual_seq_lengths_query INT32 ``[B]`` (cumulative for TND), 4 actual_seq_lengths_key
  INT32 ``[B]``, 5 block_table INT32 ``[B, max_blocks]``.  Outputs: sparse_indices INT32
  ``[T, KV_N, topk]`` (``[B, S, KV_N, topk]``) and the selected scores, which the API returns only
  with ``return_value=True`` (unsupported with a paged key), so only the indices are replayed.
  NPU: ``torch_npu.npu_lightning_indexer`` (msmodeling: the public aclnnLightningIndexer path; the
  ``_C_ascend`` variant launches ``LightningIndexerVllm``).
* ``SparseFlashAttention`` (9 inputs): 0 query ``[T, N, 512]``, 1 key and 2 value caches
  ``[blocks, block_size, KV_N, 512]``, 3 sparse_indices INT32 ``[T, KV_N, topk]``, 4 block_table,
  5 actual_seq_lengths_query (cumulative), 6 actual_seq_lengths_kv, 7 query_rope ``[T, N, 64]``,
  8 key_rope ``[blocks, block_size, KV_N, 64]``.  Output: attention ``[T, N, 512]``.
  NPU: ``torch.ops._C_ascend.npu_sparse_flash_attention`` (msmodeling's replay API; vLLM-Ascend's
  binding ``(query, key, value, sparse_indices, scale_value, sparse_block_size, *, block_table,
  actual_seq_lengths_query, actual_seq_lengths_kv, query_rope, key_rope, layout_query, layout_kv,
  sparse_mode) -> Tensor``), with ``sparse_block_size=1``, ``PA_BSND`` and ``sparse_mode=3``.

KV lengths come from the runtime metadata or ``avg_seq_len`` (as for FusedInferAttentionScore),
else the block table's capacity (msmodeling); query tokens split evenly over the requests.

The indexer's score of KV position j for a query token is ``sum_g w_g relu(q_g . k_j)`` over the N1
query heads of a KV head, masked rightDownCausal (position j visible to query i of an n-token request
with L KV tokens when j <= L - n + i); the output lists the top-k positions by descending score, ties
by ascending position, -1 where fewer positions are visible.  Its query, key and weights are small
random integers (+-1..4), so every implementation computes the scores exactly and the selection is
reproducible bit for bit (float rounding would reorder near-equal scores).  The sparse attention's
indices are, per query token, top-k distinct visible positions drawn in sorted order (one per stratum
of the visible range), -1 after the visible ones, as the indexer hands them over.

Portable: the indexer as a float32 matmul, ReLU, weighted sum, stable descending sort; the sparse
attention as a gather of the selected rows through the block table and ``scaled_dot_product_attention``
of each token over its rows (invalid ones masked).  References: float64, one request at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels.mla_prefill import (
    RUNTIME_RULE,
    build_block_table,
    check_paged_lengths,
    gather_blocks,
    metadata_kv_lengths,
    packed_positions,
    packed_query_lengths,
    padded_index,
    visible_mask,
)
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

MAX_SPARSE_COUNT = 2048  # the indexer's sparse_count range is [1, 2048]


@dataclass(frozen=True)
class SparsePlan:
    """What both kernels' calls need: layout, heads, paged KV and per-request lengths."""

    layout: str  # TND or BSND
    heads: int
    kv_heads: int
    dim: int
    rope_dim: int
    value_dim: int
    block_size: int
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    topk: int

    @property
    def batch(self) -> int:
        return len(self.q_lens)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.dim + self.rope_dim)

    def visible(self) -> list[int]:
        """Per query token (in order): how many KV positions it sees under rightDownCausal."""
        return [kv - n + i + 1 for n, kv in zip(self.q_lens, self.kv_lens) for i in range(n)]


def _spec(row: KernelRow, index: int, name: str, rank: int | None = None) -> TensorSpec:
    spec = row.inputs[index] if index < len(row.inputs) else None
    if spec is None or spec.shape is None or (rank is not None and len(spec.shape) != rank):
        found = shape_text(spec) if spec is not None else "(missing)"
        raise CaseBuildError(f"{row.kernel_type} needs {name} in input slot {index}"
                             + (f" as a {rank}-d tensor" if rank else "") + f", got {found}")  # fmt: skip
    return spec


def _int32(row: KernelRow, spec: TensorSpec, name: str, shape: tuple[int, ...]) -> None:
    if spec.dtype != "INT32" or spec.shape != shape:
        raise CaseBuildError(f"{row.kernel_type}: {name} {shape_text(spec)} {spec.dtype}, expected "
                             f"{shape_text(shape)} INT32")  # fmt: skip


def _plan(row: KernelRow, slots: dict[str, int], value_dim: int, rope_dim: int, topk: int) -> SparsePlan:
    """The shared part: query layout and heads, the paged key, the lengths and the block table."""
    if len(row.inputs) > len(slots) and any(s.present for s in row.inputs[len(slots):]):
        raise CaseBuildError(f"{row.kernel_type} takes {len(slots)} inputs, the row has more")
    query, key = _spec(row, slots["query"], "query"), _spec(row, slots["key"], "key (PA_BSND cache)", 4)
    table = _spec(row, slots["block_table"], "block_table", 2)
    assert query.shape is not None and key.shape is not None and table.shape is not None
    q, (pool, block_size, kv_heads, dim) = query.shape, key.shape
    if len(q) not in (3, 4) or query.dtype not in FLOATING or key.dtype != query.dtype:
        raise CaseBuildError(f"{row.kernel_type}: query {shape_text(q)} {query.dtype} is neither TND nor BSND "
                             f"of the key's dtype {key.dtype}")  # fmt: skip
    layout, heads, batch = ("TND", q[1], table.shape[0]) if len(q) == 3 else ("BSND", q[2], q[0])
    if q[-1] != dim or heads % kv_heads or batch != table.shape[0] or table.dtype != "INT32":
        raise CaseBuildError(f"{row.kernel_type}: query {shape_text(q)}, key {shape_text(key)} and block_table "
                             f"{shape_text(table)} {table.dtype} do not fit one paged attention")  # fmt: skip
    for name in ("q_lens", "kv_lens"):
        _int32(row, _spec(row, slots[name], name), f"input slot {slots[name]}", (batch,))
    q_lens = [q[1]] * batch if layout == "BSND" else packed_query_lengths(row, q[0], batch)
    capacity = min(table.shape[1], pool) * block_size  # msmodeling's fallback: the block table's capacity
    kv_lens = metadata_kv_lengths(row, batch, [capacity] * batch)
    check_paged_lengths(row, kv_lens, block_size, table, pool)
    if any(n > kv for n, kv in zip(q_lens, kv_lens)):
        raise CaseBuildError(f"{row.kernel_type}: query lengths {q_lens} exceed the KV lengths {kv_lens}")
    return SparsePlan(layout, heads, kv_heads, dim, rope_dim, value_dim, block_size, tuple(q_lens), tuple(kv_lens),
                      topk)  # fmt: skip


def _lengths(plan: SparsePlan, device: "torch.device") -> "tuple[torch.Tensor, torch.Tensor]":
    """The INT32 length inputs: cumulative query lengths for TND, per request otherwise; KV per request."""
    import torch

    q_lens = list(accumulate(plan.q_lens)) if plan.layout == "TND" else list(plan.q_lens)
    return (torch.tensor(q_lens, dtype=torch.int32, device=device),
            torch.tensor(plan.kv_lens, dtype=torch.int32, device=device))  # fmt: skip


def _table(row: KernelRow, plan: SparsePlan, pool: int, slot: int, device: "torch.device",
           generator: "torch.Generator") -> "torch.Tensor":  # fmt: skip
    shape = row.inputs[slot].shape
    assert shape is not None
    return build_block_table(plan.kv_lens, plan.block_size, pool, shape, device, generator)


def _request_kv(cache: "torch.Tensor", table: "torch.Tensor", plan: SparsePlan, b: int) -> "torch.Tensor":
    """Request ``b``'s KV sequence [L_b, KV_N, dim] in float64 on the CPU."""
    n = plan.kv_lens[b]
    ids = table[b : b + 1, : math.ceil(n / plan.block_size)].long()
    return gather_blocks(cache, ids, plan.kv_heads, cache.shape[-1])[0, :n].to("cpu").double()


# ------------------------------------------------------------------ LightningIndexer
LI_SLOTS = {"query": 0, "key": 1, "weights": 2, "q_lens": 3, "kv_lens": 4, "block_table": 5}


def indexer_plan(row: KernelRow) -> SparsePlan:
    out = row.outputs[0] if row.outputs else None
    topk = out.shape[-1] if out is not None and out.shape else 0
    plan = _plan(row, LI_SLOTS, 0, 0, topk)
    weights = _spec(row, LI_SLOTS["weights"], "weights")
    query = row.inputs[0].shape or ()
    if weights.shape != query[:-1] or weights.dtype != row.inputs[0].dtype:
        raise CaseBuildError(f"{row.kernel_type}: weights {shape_text(weights)} {weights.dtype} should be "
                             f"{shape_text(query[:-1])} {row.inputs[0].dtype}")  # fmt: skip
    expected = (*query[:-2], plan.kv_heads, topk)
    if out is None or out.shape != expected or out.dtype != "INT32" or not 1 <= topk <= MAX_SPARSE_COUNT:
        raise CaseBuildError(f"{row.kernel_type}: sparse_indices {shape_text(out)} should be {shape_text(expected)} "
                             f"INT32 with 1 <= topk <= {MAX_SPARSE_COUNT}")  # fmt: skip
    return plan


class LightningIndexerReplay(OpReplay):
    kernel_types = ("LightningIndexer",)
    npu_api = "torch_npu.npu_lightning_indexer"
    signature_rule = RUNTIME_RULE

    def check(self, row: KernelRow) -> None:
        indexer_plan(row)

    def expected_outputs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        return row.outputs[:1]  # the scores are not returned with a paged key (return_value=False)

    def _integers(self, spec: TensorSpec, device: "torch.device", generator: "torch.Generator") -> "torch.Tensor":
        """Random +-1..4 in the slot's dtype: exact in bf16 and in any float32 accumulation of these scores."""
        import torch

        assert spec.shape is not None
        magnitude = torch.randint(1, 5, spec.shape, generator=generator, device=device)
        return self.random(spec, device, generator).sign_().mul_(magnitude.to(spec.torch_dtype()))

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        plan = indexer_plan(row)
        query, key, weights = (self._integers(row.inputs[i], device, generator) for i in range(3))
        q_lens, kv_lens = _lengths(plan, device)
        table = _table(row, plan, key.shape[0], LI_SLOTS["block_table"], device, generator)
        seq, span = max(plan.q_lens), math.ceil(max(plan.kv_lens) / plan.block_size) * plan.block_size
        q_index = out_index = None
        if plan.layout == "TND" and len(set(plan.q_lens)) > 1:
            q_index = padded_index(plan.q_lens, seq, device)
            out_index = packed_positions(plan.q_lens, seq, device)
        visible = visible_mask(plan.q_lens, plan.kv_lens, span, True, device)[:, None]  # [B, 1, S, L]
        return query, key, weights, q_lens, kv_lens, table, (plan, q_index, out_index, visible)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        query, key, weights, q_lens, kv_lens, table, (plan, *_) = args
        return self.api_call(
            query, key, weights, actual_seq_lengths_query=q_lens, actual_seq_lengths_key=kv_lens,
            block_table=table, layout_query=plan.layout, layout_key="PA_BSND", sparse_count=plan.topk,
            sparse_mode=3, select=(0,),
        )  # fmt: skip

    def run(self, query: "torch.Tensor", key: "torch.Tensor", weights: "torch.Tensor", q_lens: "torch.Tensor",
            kv_lens: "torch.Tensor", table: "torch.Tensor", case: tuple[Any, ...]) -> "torch.Tensor":  # fmt: skip
        import torch

        plan, q_index, out_index, visible = case
        batch, seq, kv_heads, k = plan.batch, max(plan.q_lens), plan.kv_heads, plan.topk
        if plan.layout == "TND":
            query = query[q_index] if q_index is not None else query.view(batch, seq, *query.shape[1:])
            weights = weights[q_index] if q_index is not None else weights.view(batch, seq, -1)
        ids = table[:, : visible.shape[-1] // plan.block_size].long()
        keys = gather_blocks(key, ids, kv_heads, plan.dim).float().permute(0, 2, 3, 1)  # [B, KV_N, D, L]
        q = query.float().view(batch, seq, kv_heads, -1, plan.dim).transpose(1, 2).flatten(2, 3)  # [B, KV_N, S*G, D]
        scores = torch.matmul(q, keys).relu_().view(batch, kv_heads, seq, -1, keys.shape[-1])  # [B, KV_N, S, G, L]
        w = weights.float().view(batch, seq, kv_heads, 1, -1).transpose(1, 2)  # [B, KV_N, S, 1, G]
        scores = torch.matmul(w, scores).squeeze(-2).masked_fill_(~visible, -math.inf)  # [B, KV_N, S, L]
        values, order = torch.sort(scores, dim=-1, descending=True, stable=True)
        top = order[..., :k].masked_fill_(values[..., :k] == -math.inf, -1)
        if top.shape[-1] < k:  # fewer KV positions than top-k
            top = torch.nn.functional.pad(top, (0, k - top.shape[-1]), value=-1)
        top = top.transpose(1, 2).to(torch.int32)  # [B, S, KV_N, k]
        if plan.layout == "BSND":
            return top
        top = top.reshape(batch * seq, kv_heads, k)
        return top if out_index is None else top[out_index]

    def reference(self, query: "torch.Tensor", key: "torch.Tensor", weights: "torch.Tensor",
                  *rest: Any) -> "torch.Tensor":  # fmt: skip
        import torch

        _, _, table, (plan, *_) = rest
        tokens_q, tokens_w = query.reshape(-1, *query.shape[-2:]), weights.reshape(-1, weights.shape[-1])
        results, start = [], 0
        for b, (n, kv) in enumerate(zip(plan.q_lens, plan.kv_lens)):
            k = _request_kv(key, table, plan, b)  # [L, KV_N, D]
            q = tokens_q[start : start + n].to("cpu").double().view(n, plan.kv_heads, -1, plan.dim)
            w = tokens_w[start : start + n].to("cpu").double().view(n, plan.kv_heads, -1)
            scores = torch.einsum("shg,shgl->shl", w, torch.einsum("shgd,lhd->shgl", q, k).clamp_min(0))
            limit = kv - n + torch.arange(n)[:, None, None]
            # score-major, position-minor keys: distinct, so the top-k order is unique (exact in float64)
            keyed = (scores * (kv + 1) - torch.arange(kv)).masked_fill(torch.arange(kv) > limit, -math.inf)
            found = keyed.topk(min(plan.topk, kv), dim=-1)
            top = found.indices.masked_fill(found.values == -math.inf, -1)
            results.append(torch.nn.functional.pad(top, (0, plan.topk - top.shape[-1]), value=-1))
            start += n
        out = torch.cat(results).to(torch.int32)
        return out.view(plan.batch, -1, plan.kv_heads, plan.topk) if plan.layout == "BSND" else out


# ------------------------------------------------------------------ SparseFlashAttention
SFA_SLOTS = {"query": 0, "key": 1, "value": 2, "indices": 3, "block_table": 4, "q_lens": 5, "kv_lens": 6,
             "query_rope": 7, "key_rope": 8}  # fmt: skip
_GATHER_CHUNK = 1 << 27  # gathered KV elements per step: bounds the memory of long prefill rows


def sparse_attention_plan(row: KernelRow) -> SparsePlan:
    key, value = _spec(row, 1, "key", 4), _spec(row, 2, "value", 4)
    indices = _spec(row, 3, "sparse_indices")
    q_rope, k_rope = (row.inputs[i] if i < len(row.inputs) and row.inputs[i].present else None for i in (7, 8))
    assert key.shape is not None and value.shape is not None and indices.shape is not None
    if value.shape[:3] != key.shape[:3] or value.dtype != key.dtype or (q_rope is None) != (k_rope is None):
        raise CaseBuildError(f"{row.kernel_type}: value {shape_text(value)} must share the key cache "
                             f"{shape_text(key)}'s blocks, and query_rope/key_rope come together")  # fmt: skip
    rope = q_rope.shape[-1] if q_rope is not None and q_rope.shape else 0
    plan = _plan(row, SFA_SLOTS, value.shape[-1], rope, indices.shape[-1])
    query = row.inputs[0].shape or ()
    _int32(row, indices, "sparse_indices", (*query[:-2], plan.kv_heads, plan.topk))
    if q_rope is not None and k_rope is not None and (
            q_rope.shape != (*query[:-1], rope) or k_rope.shape != (*key.shape[:3], rope)):  # fmt: skip
        raise CaseBuildError(f"{row.kernel_type}: query_rope {shape_text(q_rope)} / key_rope {shape_text(k_rope)} "
                             f"do not extend query {shape_text(query)} / key {shape_text(key)}")  # fmt: skip
    out = row.outputs[0] if row.outputs else None
    if out is None or out.shape != (*query[:-1], plan.value_dim) or out.dtype != row.inputs[0].dtype:
        raise CaseBuildError(f"{row.kernel_type}: output {shape_text(out)} should be "
                             f"{shape_text((*query[:-1], plan.value_dim))} {row.inputs[0].dtype}")  # fmt: skip
    return plan


def _sparse_indices(plan: SparsePlan, device: "torch.device", generator: "torch.Generator") -> "torch.Tensor":
    """[T, KV_N, topk] INT32: per token, min(topk, visible) distinct visible positions in ascending order,
    one drawn from each equal stratum of [0, visible), then -1."""
    import torch

    visible = torch.tensor(plan.visible(), device=device)[:, None]
    count = visible.clamp(max=plan.topk)
    k = torch.arange(plan.topk, device=device)[None]
    base = k * visible // count
    width = (k + 1) * visible // count - base  # >= 1 while k < count
    u = torch.rand(visible.shape[0], plan.topk, generator=generator, device=device)
    positions = (base + (u * width).long()).masked_fill_(k >= count, -1)
    return positions.to(torch.int32)[:, None, :].expand(-1, plan.kv_heads, -1).contiguous()


class SparseFlashAttentionReplay(OpReplay):
    kernel_types = ("SparseFlashAttention",)
    npu_api = "torch.ops._C_ascend.npu_sparse_flash_attention"
    signature_rule = RUNTIME_RULE

    def check(self, row: KernelRow) -> None:
        sparse_attention_plan(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        plan = sparse_attention_plan(row)
        query, key, value = (self.random(row.inputs[i], device, generator) for i in range(3))
        q_rope, k_rope = (self.random(row.inputs[i], device, generator) if plan.rope_dim else None for i in (7, 8))
        indices = _sparse_indices(plan, device, generator).view(*query.shape[:-2], plan.kv_heads, plan.topk)
        q_lens, kv_lens = _lengths(plan, device)
        table = _table(row, plan, key.shape[0], SFA_SLOTS["block_table"], device, generator)
        request = torch.tensor([b for b, n in enumerate(plan.q_lens) for _ in range(n)], device=device)
        return query, key, value, indices, table, q_lens, kv_lens, q_rope, k_rope, (plan, request)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        query, key, value, indices, table, q_lens, kv_lens, q_rope, k_rope, (plan, _) = args
        return self.api_call(
            query, key, value, indices, plan.scale, 1, block_table=table, actual_seq_lengths_query=q_lens,
            actual_seq_lengths_kv=kv_lens, query_rope=q_rope, key_rope=k_rope, layout_query=plan.layout,
            layout_kv="PA_BSND", sparse_mode=3,
        )  # fmt: skip

    def run(self, query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor", indices: "torch.Tensor",
            table: "torch.Tensor", *rest: Any) -> "torch.Tensor":  # fmt: skip
        import torch
        import torch.nn.functional as F

        _, _, q_rope, k_rope, (plan, request) = rest
        kv_heads, bs, k = plan.kv_heads, plan.block_size, plan.topk
        tokens = query.reshape(-1, plan.heads, plan.dim)
        if q_rope is not None:
            tokens = torch.cat((tokens, q_rope.reshape(-1, plan.heads, plan.rope_dim)), -1)
        idx = indices.reshape(-1, kv_heads, k)
        head = torch.arange(kv_heads, device=idx.device)[None, :, None]
        step = max(1, _GATHER_CHUNK // (kv_heads * k * (plan.dim + plan.rope_dim + plan.value_dim)))
        outs = []
        for start in range(0, idx.shape[0], step):  # one step for decode rows
            part, req = idx[start : start + step], request[start : start + step]
            pos = part.clamp(min=0).long()
            slot = table.long()[req[:, None, None], pos // bs] * bs + pos % bs  # [t, KV_N, k]
            keys = key.reshape(-1, kv_heads, plan.dim)[slot, head]
            if k_rope is not None:
                keys = torch.cat((keys, k_rope.reshape(-1, kv_heads, plan.rope_dim)[slot, head]), -1)
            values = value.reshape(-1, kv_heads, plan.value_dim)[slot, head]
            q = tokens[start : start + step].view(-1, kv_heads, plan.heads // kv_heads, tokens.shape[-1])
            outs.append(F.scaled_dot_product_attention(q, keys, values, attn_mask=(part >= 0)[:, :, None, :],
                                                       scale=plan.scale))  # fmt: skip
        return torch.cat(outs).reshape(*query.shape[:-1], plan.value_dim)

    def reference(self, query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor", indices: "torch.Tensor",
                  table: "torch.Tensor", *rest: Any) -> "torch.Tensor":  # fmt: skip
        import torch

        _, _, q_rope, k_rope, (plan, _) = rest
        tokens = query.reshape(-1, plan.heads, plan.dim)
        if q_rope is not None:
            tokens = torch.cat((tokens, q_rope.reshape(-1, plan.heads, plan.rope_dim)), -1)
        idx, blocks = indices.reshape(-1, plan.kv_heads, plan.topk).to("cpu").long(), table.to("cpu").long()
        caches = [c.reshape(-1, plan.kv_heads, c.shape[-1]) for c in (key, k_rope, value) if c is not None]
        head = torch.arange(plan.kv_heads)[:, None]
        outs = []
        for t, b in enumerate(b for b, n in enumerate(plan.q_lens) for _ in range(n)):  # a token at a time
            pos, ok = idx[t].clamp(min=0), idx[t] >= 0  # [KV_N, topk]
            slot = blocks[b, pos // plan.block_size] * plan.block_size + pos % plan.block_size
            rows = [c[slot.to(c.device), head.to(c.device)].to("cpu").double() for c in caches]  # [KV_N, topk, dim]
            keys, values = torch.cat(rows[:-1], -1), rows[-1]
            q = tokens[t].to("cpu").double().view(plan.kv_heads, -1, tokens.shape[-1])  # [KV_N, G, D]
            scores = (torch.einsum("hgd,hkd->hgk", q, keys) * plan.scale).masked_fill(~ok[:, None, :], -math.inf)
            outs.append(torch.einsum("hgk,hkd->hgd", torch.softmax(scores, -1), values).reshape(plan.heads, -1))
        return torch.cat(outs).reshape(*query.shape[:-1], plan.value_dim)
