"""What a FusedInferAttentionScore row asks of the kernel: its plan (layouts, heads, sequence lengths, paging), read from the row's slots and runtime metadata columns.

The row layouts are described in ``perf_plugin.replay.kernels.fused_infer_attention``.
"""


from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.mla_prefill import (
    KV_VALUES,
    check_paged_lengths,
    distribute,
    lengths_from_cumulative,
    metadata_kv_lengths,
    packed_query_lengths,
    runtime_ints,
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
        """The KV length the portable path attends over: the longest request's.  A paged cache's
        blocks are gathered whole and cut to it, so equal lengths need no mask, as the fused kernel
        reads no position past a request's length."""
        return max(self.kv_lens)

    @property
    def portable_kernel(self) -> str:
        """Which attention the portable path runs: ``causal`` where every request attends causally
        over its own equal tokens (one causal kernel, which skips the upper triangle), ``masked``
        where a mask hides positions (causal otherwise, or a request shorter than the KV span: the
        masked pairs are computed too), else ``unmasked``."""
        seq, span = max(self.q_lens), self.kv_span
        causal = self.sparse_mode == 3 and seq > 1
        if causal and not self.with_lse and set(self.q_lens) == set(self.kv_lens) == {seq}:
            return "causal"
        return "masked" if causal or any(n < span for n in self.kv_lens) else "unmasked"

    @property
    def kv_blocks(self) -> int:
        """Blocks per request the portable path gathers (paged)."""
        return math.ceil(self.kv_span / self.block_size)

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
    # causal self-attention of equal lengths: the fused causal kernel, heads unfolded, no mask
    is_causal: bool = False
