"""The geometry and the math of Ascend flash attention, shared by its forward and backward replays.

``Geometry`` is what a ``FlashAttentionScore`` / ``FlashAttentionScoreGrad`` row says the kernel
computes (layout, batch, heads, GQA, sequence lengths, mask); ``fused_forward`` /
``fused_backward`` run aten's fused attention on BNSD views of the row's tensors, and
``math_forward`` / ``math_backward`` are the float64 references (one KV head at a time).  The row
layouts and the conventions are described in ``perf_plugin.replay.kernels.flash_attention``.
"""


from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

COMPRESSED_MASK = (2048, 2048)  # the mask sparse_mode 2/3 take, whatever the sequence lengths
STATS_WIDTH = 8  # softmax_max/softmax_sum repeat each row's value over a last dim of 8
NO_MASK, LEFT_UP_CAUSAL = 0, 2  # sparse_mode values
FORWARD_INPUTS = ("query", "key", "value", "pse", "drop_mask", "padding_mask", "atten_mask")
# ||out - ref|| / ||ref|| measured over 3-5 seeds on the CPU (reduced Level2 rows, S=256) and an H100
# (the real rows, S=4096): BF16 attention_out 1.9e-3 to 2.1e-3, dq/dk/dv 2.3e-3 to 4.2e-3; FLOAT16
# 2.5e-4 and 5.4e-4; FLOAT (the lse, float32 rows) 2e-6 at most, under the default 1e-4.  About
# 2.5x the worst: a wrong mask, scale or query-to-KV head mapping errs by 10% or more.
HALF_TOLERANCE = MappingProxyType({"bfloat16": 1e-2, "float16": 1.5e-3})


@dataclass(frozen=True)
class Geometry:
    """What the kernel computes for a row: layout, sizes and the mask."""

    layout: str  # SBH, BSH, BSND or BNSD
    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def sparse_mode(self) -> int:
        return LEFT_UP_CAUSAL if self.causal else NO_MASK

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def views(self, *tensors: "torch.Tensor") -> list["torch.Tensor"]:
        """BNSD views of row-layout tensors in the order q, k, v, then any of q's shape."""
        return [self._to_bnsd(t, self.kv_heads if i in (1, 2) else self.heads) for i, t in enumerate(tensors)]

    def _to_bnsd(self, t: "torch.Tensor", heads: int) -> "torch.Tensor":
        if self.layout in ("SBH", "BSH"):
            t = t.view(t.shape[0], t.shape[1], heads, self.head_dim)
        if self.layout == "SBH":
            return t.permute(1, 2, 0, 3)
        return t if self.layout == "BNSD" else t.transpose(1, 2)

    def from_bnsd(self, t: "torch.Tensor") -> "torch.Tensor":
        """[B, N, S, D] back to ``layout`` (a view where the kernel wrote that memory order)."""
        if self.layout in ("BNSD", "BSND"):
            return t if self.layout == "BNSD" else t.transpose(1, 2)
        return (t.permute(2, 0, 1, 3) if self.layout == "SBH" else t.transpose(1, 2)).flatten(2)


# ----------------------------------------------------------------------------- row checks
def _fail(row: KernelRow, message: str) -> CaseBuildError:
    return CaseBuildError(f"{row.kernel_type} {message}")


def _slot(side: tuple[TensorSpec, ...], index: int) -> TensorSpec:
    return side[index] if index < len(side) else TensorSpec(None, "")


def _require_empty(row: KernelRow, slots: range, names: tuple[str, ...], why: str) -> None:
    for i in slots:
        if _slot(row.inputs, i).present:
            name = names[i] if i < len(names) else "optional input"
            raise _fail(row, f"{name} (slot {i}) {shape_text(row.inputs[i])} is present: {why}")


def _mask_is_causal(row: KernelRow, slot: int) -> bool:
    mask = _slot(row.inputs, slot)
    if mask.present and (mask.shape != COMPRESSED_MASK or mask.dtype not in ("BOOL", "UINT8")):
        raise _fail(
            row, f"atten_mask (slot {slot}) {shape_text(mask)} {mask.dtype}: only the 2048x2048 BOOL compressed "
            "causal mask (sparse_mode 2/3) is replayed; an explicit mask's values are not recorded",
        )  # fmt: skip
    return mask.present


def _layouts(q: tuple[int, ...], k: tuple[int, ...], b: int, n: int, s: int) -> list[tuple[str, int, int, int]]:
    """(layout, head dim, KV heads, KV length) of every layout q and k fit."""
    found = []
    if len(q) == len(k) == 3 and q[2] % n == 0:
        d = q[2] // n
        if q[:2] == (s, b) and k[1] == b:
            found.append(("SBH", d, k[2] // d, k[0]))
        if q[:2] == (b, s) and k[0] == b:
            found.append(("BSH", d, k[2] // d, k[1]))
        found = [f for f in found if f[1] and k[2] == f[1] * f[2]]
    if len(q) == len(k) == 4 and q[0] == k[0] == b and q[3] == k[3]:
        if q[1:3] == (n, s):
            found.append(("BNSD", q[3], k[1], k[2]))
        if q[1:3] == (s, n):
            found.append(("BSND", q[3], k[2], k[1]))
    return found


def _geometry(row: KernelRow, qkv: tuple[TensorSpec, ...], stats: TensorSpec, causal: bool) -> Geometry:
    q, k, v = (_slot(qkv, i) for i in range(3))
    if q.shape is None or k.shape is None or v.shape is None:
        raise _fail(row, "needs query, key and value in slots 0-2")
    if stats.shape is None or len(stats.shape) != 4 or stats.shape[3] != STATS_WIDTH or stats.dtype != "FLOAT":
        raise _fail(
            row, f"softmax_max {shape_text(stats)} {stats.dtype} should be [B,N,Sq,8] FLOAT ([T,N,8] is the "
            "TND layout, which needs actual_seq_qlen and actual_seq_kvlen [B] in slots 8 and 9)",
        )  # fmt: skip
    if v.shape != k.shape:
        raise _fail(row, f"value {shape_text(v)} differs from key {shape_text(k)}")
    if len({q.dtype, k.dtype, v.dtype}) != 1 or q.dtype not in FLOATING:
        raise _fail(row, f"query, key and value must share one floating dtype, got {q.dtype};{k.dtype};{v.dtype}")
    b, n, s = stats.shape[:3]
    for layout, d, kv_heads, seq_kv in _layouts(q.shape, k.shape, b, n, s):
        if kv_heads > 0 and n % kv_heads == 0:
            return Geometry(layout, b, n, kv_heads, s, seq_kv, d, causal)
    raise _fail(
        row, f"query {shape_text(q)} / key {shape_text(k)} fit none of SBH, BSH, BNSD, BSND with softmax_max "
        f"{shape_text(stats)} (B={b}, N={n}, Sq={s}; the KV heads must divide N)",
    )  # fmt: skip


def _expect(row: KernelRow, name: str, spec: TensorSpec, like: TensorSpec) -> None:
    if spec.shape != like.shape or spec.dtype != like.dtype:
        raise _fail(row, f"{name} {shape_text(spec)} {spec.dtype} should be {shape_text(like)} {like.dtype}")


def records_stats(row: KernelRow) -> bool:
    """Whether a forward row records softmax_max/softmax_sum (the NPU kernel's outputs); a row from
    a PyTorch trace records attention_out alone, which is all SDPA returns to the model."""
    return _slot(row.outputs, 0).present


def _bnsd_geometry(row: KernelRow, causal: bool) -> Geometry:
    """A forward row without the stats: BNSD operands give the heads."""
    q, k, v = (_slot(row.inputs, i) for i in range(3))
    if q.shape is None or k.shape is None or len(q.shape) != 4 or len(k.shape) != 4 or v.shape != k.shape:
        raise _fail(row, "without softmax_max, needs BNSD query, key and value [B,N,S,D] in slots 0-2")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise _fail(row, f"query {shape_text(q)} and key {shape_text(k)} are not BNSD with KV heads dividing N")
    if len({q.dtype, k.dtype, v.dtype}) != 1 or q.dtype not in FLOATING:
        raise _fail(row, f"query, key and value must share one floating dtype, got {q.dtype};{k.dtype};{v.dtype}")
    b, n, s, d = q.shape
    return Geometry("BNSD", b, n, k.shape[1], s, k.shape[2], d, causal)


def forward_geometry(row: KernelRow) -> Geometry:
    ins, outs = row.inputs, row.outputs
    _require_empty(row, range(3, 6), FORWARD_INPUTS, "pse, dropout and padding masks are not replayed")
    causal = _mask_is_causal(row, 6)
    _require_empty(row, range(7, len(ins)), (), "prefix and FP8 inputs are not replayed (TND lengths need a 3-D query)")
    if len(outs) != 4 or outs[2].present:
        raise _fail(row, "needs outputs softmax_max;softmax_sum;(empty softmax_out);attention_out")
    _expect(row, "attention_out (output 3)", outs[3], ins[0])
    if not records_stats(row):
        if outs[1].present:
            raise _fail(row, "records softmax_sum without softmax_max")
        return _bnsd_geometry(row, causal)
    g = _geometry(row, ins, _slot(outs, 0), causal)
    _expect(row, "softmax_sum (output 1)", outs[1], outs[0])
    return g


def grad_geometry(row: KernelRow) -> Geometry:
    ins, outs = row.inputs, row.outputs
    if len(ins) < 9 or ins[7].present:
        raise _fail(row, "needs inputs q;k;v;dy;mask;softmax_max;softmax_sum;;attention_in (softmax_in slot 7 empty)")
    causal = _mask_is_causal(row, 4)
    _require_empty(row, range(9, len(ins)), (), "prefix, varlen (TND) and FP8 inputs are not replayed")
    g = _geometry(row, ins, ins[5], causal)
    for name, slot, same in (("dy (slot 3)", 3, 0), ("softmax_sum (slot 6)", 6, 5), ("attention_in (slot 8)", 8, 0)):
        _expect(row, name, ins[slot], ins[same])
    if len(outs) < 3 or any(s.present for s in outs[3:]):
        raise _fail(row, "needs outputs dq;dk;dv (dpse and later slots empty: pse is not replayed)")
    for name, out, like in zip(("dq", "dk", "dv"), outs, ins):
        _expect(row, name, out, like)
    return g


# ----------------------------------------------------------------------------- computation
def _flash_on_cuda(q: "torch.Tensor", g: Geometry) -> bool:
    import torch

    # flash-attn aligns a causal mask to the bottom right when Sq != Skv; sparse_mode 2 and torch's
    # is_causal align it to the top left, as the efficient kernel does
    square = not g.causal or g.seq_q == g.seq_kv
    return q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16) and g.head_dim <= 256 and square


def dispatched_forward(views: list["torch.Tensor"], g: Geometry) -> "torch.Tensor":
    """The attention output through ``scaled_dot_product_attention`` itself: PyTorch picks the
    backend (cuDNN, flash, efficient) the way it did for the model that recorded the row."""
    import torch

    q, k, v = views
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=g.causal, scale=g.scale, enable_gqa=g.group > 1
    )


def fused_forward(views: list["torch.Tensor"], g: Geometry) -> tuple["torch.Tensor", ...]:
    """(out, lse [B,N,Sq] float32) from one fused kernel, on BNSD views (q, k, v)."""
    import torch

    aten = torch.ops.aten
    q, k, v = views
    if q.device.type in ("cpu", "meta"):
        return tuple(aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, g.causal, scale=g.scale))
    if _flash_on_cuda(q, g):
        return tuple(aten._scaled_dot_product_flash_attention(q, k, v, 0.0, g.causal, False, scale=g.scale)[:2])
    k, v = k.repeat_interleave(g.group, 1), v.repeat_interleave(g.group, 1)  # one KV head per query head
    out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, g.causal, scale=g.scale)
    return out, lse[..., : g.seq_q]


def fused_backward(
    views: list["torch.Tensor"], lse: "torch.Tensor", aux: tuple[Any, ...], g: Geometry
) -> tuple["torch.Tensor", ...]:
    """(dq, dk, dv) on BNSD views (q, k, v, dy, out) and the forward's lse."""
    import torch

    aten = torch.ops.aten
    q, k, v, dy, out = views
    if q.device.type in ("cpu", "meta"):
        cpu = aten._scaled_dot_product_flash_attention_for_cpu_backward
        return tuple(cpu(dy, q, k, v, out, lse, 0.0, g.causal, scale=g.scale))
    if _flash_on_cuda(q, g):
        flash = aten._scaled_dot_product_flash_attention_backward  # aux: its unread RNG state
        return tuple(flash(dy, q, k, v, out, lse, None, None, g.seq_q, g.seq_kv, 0.0, g.causal, *aux, scale=g.scale))
    k, v = k.repeat_interleave(g.group, 1), v.repeat_interleave(g.group, 1)
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        dy, q, k, v, None, out, lse, aux[0], aux[1], 0.0, [True, True, True, False], g.causal, scale=g.scale
    )
    grouped = (g.batch, g.kv_heads, g.group, g.seq_kv, g.head_dim)
    return dq, dk.view(grouped).sum(2), dv.view(grouped).sum(2)


def backward_aux(q: "torch.Tensor", g: Geometry) -> tuple[Any, ...]:
    """The RNG-state tensors the CUDA backward kernels take (unread without dropout)."""
    import torch

    if q.device.type != "cuda":
        return ()
    dtype, size = (torch.uint64, (2,)) if _flash_on_cuda(q, g) else (torch.int64, ())
    return torch.empty(size, dtype=dtype, device=q.device), torch.empty((), dtype=dtype, device=q.device)


def _probs(qg: "torch.Tensor", kh: "torch.Tensor", g: Geometry) -> tuple["torch.Tensor", ...]:
    """Softmax of scale * q k^T (one query group [G,Sq,D] against its KV head), its row max and sum."""
    import torch

    s = torch.matmul(qg, kh.transpose(0, 1)).mul_(g.scale)
    if g.causal:  # left-up causal: query i sees keys j <= i
        s.masked_fill_(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu_(1), float("-inf"))
    peak = s.amax(-1, keepdim=True)
    e = s.sub_(peak).exp_()
    total = e.sum(-1, keepdim=True)
    return e.div_(total), peak, total


def math_forward(views: list["torch.Tensor"], g: Geometry) -> tuple["torch.Tensor", ...]:
    """(out, row max, row sum of exp [B,N,Sq,1]) on BNSD (q, k, v) in q's dtype, one KV head at a time."""
    import torch

    q, k, v = views
    out, stats = torch.empty_like(q), q.new_empty((2, g.batch, g.heads, g.seq_q, 1))
    for b in range(g.batch):
        for h in range(g.kv_heads):
            heads = slice(h * g.group, (h + 1) * g.group)
            p, stats[0, b, heads], stats[1, b, heads] = _probs(q[b, heads], k[b, h], g)
            out[b, heads] = torch.matmul(p, v[b, h])
    return out, stats[0], stats[1]


def math_backward(views: list["torch.Tensor"], g: Geometry) -> tuple["torch.Tensor", ...]:
    """(dq, dk, dv) by the textbook formulas on BNSD (q, k, v, dy), one KV head at a time."""
    import torch

    q, k, v, dy = views
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    for b in range(g.batch):
        for h in range(g.kv_heads):
            heads = slice(h * g.group, (h + 1) * g.group)
            qg, dyg, kh, vh = q[b, heads], dy[b, heads], k[b, h], v[b, h]
            p = _probs(qg, kh, g)[0]
            delta = (dyg * torch.matmul(p, vh)).sum(-1, keepdim=True)
            ds = p * (torch.matmul(dyg, vh.transpose(0, 1)) - delta) * g.scale
            dq[b, heads] = torch.matmul(ds, kh)
            dk[b, h] = torch.matmul(ds.transpose(1, 2), qg).sum(0)
            dv[b, h] = torch.matmul(p.transpose(1, 2), dyg).sum(0)
    return dq, dk, dv


def float64_copies(*tensors: "torch.Tensor") -> list["torch.Tensor"]:
    import torch

    return [t.detach().to("cpu", dtype=torch.float64) for t in tensors]


def compressed_mask(device: "torch.device") -> "torch.Tensor":
    """The NPU's compressed causal mask: True (masked) strictly above the diagonal."""
    import torch

    return torch.ones(COMPRESSED_MASK, dtype=torch.bool, device=device).triu_(1)


# ----------------------------------------------------------------------------- trace ingest
