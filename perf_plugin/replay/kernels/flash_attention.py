"""``FlashAttentionScore`` / ``FlashAttentionScoreGrad``: Ascend training flash attention, both passes.

Rows (the real Level2 profile, CANN 8.3).  Forward inputs in the kernel's declared order: ``q;k;v;
pse;drop_mask;padding_mask;atten_mask;prefix;actual_seq_qlen;actual_seq_kvlen;q_start_idx;
kv_start_idx;d_scale_q;d_scale_k;d_scale_v``; outputs ``softmax_max;softmax_sum;softmax_out;
attention_out``.  The real row ``4096,1,2048;4096,1,1024;4096,1,1024;;;;2048,2048;;;;;;;;`` ->
``1,16,4096,8;1,16,4096,8;;4096,1,2048`` is SBH, GQA, with the 2048x2048 BOOL *compressed* causal
mask of sparse_mode 2/3 (which ignore pre/next_tockens, the op-plugin docs say).  Backward, as
recorded: ``q;k;v;dy;atten_mask;softmax_max;softmax_sum;softmax_in;attention_in`` and six empty
slots (the pse/drop/padding inputs, not passed, are absent, where the forward keeps empty slots:
slot 4 is the forward's mask, 5-6 its ``[B,N,S,8]`` FLOAT outputs, 8 its output); outputs
``dq;dk;dv;dpse;;``.  ``softmax_max`` ``[B,N,Sq,8]`` (op-plugin allocates it so) gives B, the
query heads N and Sq; the layout is the SBH/BSH (3-D) or BNSD/BSND (4-D) that q fits (SBH, BNSD
first); D = H_q/N, KV heads = H_kv/D (query head h reads KV head h // (N/N_kv), as torch's
enable_gqa).  Scale (not recorded): 1/sqrt(D).  Replayed: no mask (sparse_mode 0) or the
compressed causal one (sparse_mode 2, left-up = torch's ``is_causal``); refused with the reason:
pse, dropout, explicit masks (values not recorded), varlen TND, prefix, FP8 scales.

NPU: ``torch_npu.npu_fusion_attention(q, k, v, head_num, input_layout, atten_mask, scale,
keep_prob, sparse_mode)`` returns ``(attention_out, softmax_max, softmax_sum, softmax_out, seed,
offset, numels)`` (op-plugin FlashAttentionKernelNpuOpApi.cpp): select (1, 2, 0);
``npu_fusion_attention_grad(q, k, v, dy, head_num, input_layout, atten_mask, softmax_max,
softmax_sum, attention_in, scale_value, ...)`` returns ``(dq, dk, dv, dpse)``.  The op_mapping
files name no API for these kernel types.

Portable: BNSD views (no copy) through aten's fused attention with native GQA:
``_scaled_dot_product_flash_attention_for_cpu`` (+ ``_backward``) on the CPU and meta devices,
``_scaled_dot_product_flash_attention`` on CUDA (fp16/bf16, D <= 256, no causal Sq != Skv, which
flash aligns bottom-right), else the efficient kernel (KV heads repeated, their grads summed).  These keep only lse = max + log(sum), so the forward
returns ``softmax_max = lse, softmax_sum = 1`` (the same softmax exp(s - max) / sum) rather than
pay a second QK^T pass for the true max; on an NPU the reference is the true pair its kernel
writes.  The gradient's inputs are made once by a chunked float32 formula with the true max and
sum, as the NPU forward writes them.  References: float64 on the CPU, one KV head (and its query
group) at a time.

Trace ingest: the profiler (record_shapes) records SDPA's q/k/v dims and dtypes, an empty type for
an absent mask, and dropout_p, is_causal, scale, enable_gqa as concrete inputs ('0.', 'True').
``aten::scaled_dot_product_attention`` (top level, whichever kernel it runs) with no mask or
dropout becomes a forward row in BNSD layout with the slots above (the 2048x2048
mask at slot 6 when ``is_causal``; outputs ``[B,N,Sq,8]`` FLOAT x2, empty, attention_out); the
backward operators autograd calls (``_scaled_dot_product_{flash_attention_for_cpu,flash_attention,
efficient_attention,cudnn_attention}_backward``) become grad rows likewise.  Scales are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import DTYPES, FLOATING, KernelRow, TensorSpec, shape_text
from perf_plugin.trace.args import Tensor, concrete_arg, tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot, TraceMapper

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
            "varlen TND layout, whose sequence lengths the row does not record)",
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


def forward_geometry(row: KernelRow) -> Geometry:
    ins, outs = row.inputs, row.outputs
    _require_empty(row, range(3, 6), FORWARD_INPUTS, "pse, dropout and padding masks are not replayed")
    causal = _mask_is_causal(row, 6)
    _require_empty(row, range(7, len(ins)), (), "prefix, varlen (TND) and FP8 inputs are not replayed")
    g = _geometry(row, ins, _slot(outs, 0), causal)
    if len(outs) != 4 or outs[2].present:
        raise _fail(row, "needs outputs softmax_max;softmax_sum;(empty softmax_out);attention_out")
    _expect(row, "softmax_sum (output 1)", outs[1], outs[0])
    _expect(row, "attention_out (output 3)", outs[3], ins[0])
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


def _backward_aux(q: "torch.Tensor", g: Geometry) -> tuple[Any, ...]:
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


def _float64(*tensors: "torch.Tensor") -> list["torch.Tensor"]:
    import torch

    return [t.detach().to("cpu", dtype=torch.float64) for t in tensors]


def _compressed_mask(device: "torch.device") -> "torch.Tensor":
    """The NPU's compressed causal mask: True (masked) strictly above the diagonal."""
    import torch

    return torch.ones(COMPRESSED_MASK, dtype=torch.bool, device=device).triu_(1)


# ----------------------------------------------------------------------------- trace ingest
def _sdpa_operands(op: TraceOp, mask: int | None, dropout: int, first: int) -> tuple[Tensor, Tensor] | None:
    """q and k (BNSD, KV heads dividing the query heads) of an SDPA call with no mask or dropout."""
    q, k, v = (tensor_arg(op, first + i) for i in range(3))
    if q is None or k is None or v is None or v.shape != k.shape or q.rank != 4 or k.rank != 4:
        return None
    if (mask is not None and tensor_arg(op, mask) is not None) or concrete_arg(op, dropout) not in (None, 0, 0.0):
        return None
    ok = q.shape[0] == k.shape[0] and q.shape[3] == k.shape[3] and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0
    return (q, k) if ok else None


def _row(q: Tensor, k: Tensor, causal: bool, grad: bool) -> MappedOp:
    """The forward or gradient row of these BNSD operands, in the Level2 slot layout."""
    dtype, stats = q.dtype, Slot((*q.shape[:3], STATS_WIDTH), "FLOAT")
    qs, ks, none = Slot(q.shape, dtype), Slot(k.shape, dtype), Slot(None, dtype)
    mask = Slot(COMPRESSED_MASK if causal else None, "BOOL")
    if grad:
        inputs = (qs, ks, ks, qs, mask, stats, stats, none, qs, Slot(None, "INT64")) + (Slot(None, "FLOAT"),) * 5
        return MappedOp("FlashAttentionScoreGrad", inputs, (qs, ks, ks, none, none, none))
    inputs = (qs, ks, ks, none, Slot(None, "UINT8"), none, mask, *(Slot(None, "INT64"),) * 5, *(Slot(None, "FLOAT"),) * 3)
    return MappedOp("FlashAttentionScore", inputs, (stats, stats, none, qs))


def _trace_sdpa(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """``scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)``."""
    operands = _sdpa_operands(op, 3, 4, 0)
    return None if operands is None else _row(*operands, concrete_arg(op, 5) is True, grad=False)


def _trace_backward(mask: int | None, dropout: int, causal: int) -> TraceMapper:
    """The mapper of an SDPA backward operator ``(grad_out, q, k, v, ...)`` whose mask, dropout_p
    and is_causal arguments are at these positions."""

    def mapper(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
        operands, dy = _sdpa_operands(op, mask, dropout, 1), tensor_arg(op, 0)
        if operands is None or dy is None or dy.shape != operands[0].shape:
            return None
        return _row(*operands, concrete_arg(op, causal) is True, grad=True)

    return mapper


# ----------------------------------------------------------------------------- replays
class _AttentionReplay(OpReplay):
    def tolerance(self, output: TensorSpec) -> float:
        return HALF_TOLERANCE.get(DTYPES.get(output.dtype, ("", 0))[0]) or super().tolerance(output)


class FlashAttentionScoreReplay(_AttentionReplay):
    kernel_types = ("FlashAttentionScore",)
    npu_api = "torch_npu.npu_fusion_attention"
    trace_ops = MappingProxyType({"aten::scaled_dot_product_attention": _trace_sdpa})

    def check(self, row: KernelRow) -> None:
        forward_geometry(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        import torch

        g = forward_geometry(row)
        q, k, v = (self.random(spec, device, generator) for spec in row.inputs[:3])
        # softmax_sum of the (lse, 1) pair, made once so that run launches no kernel for it
        ones = torch.ones(1, 1, 1, 1, device=device).expand(g.batch, g.heads, g.seq_q, STATS_WIDTH)
        # on an NPU the outputs are the kernel's own (max, sum) pair: the reference gives that one
        return q, k, v, _compressed_mask(device) if g.causal else None, ones, device.type == "npu", g

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        q, k, v, mask, _, _, g = args
        return self.api_call(
            q, k, v, g.heads, g.layout, atten_mask=mask, scale=g.scale, keep_prob=1.0, sparse_mode=g.sparse_mode,
            select=(1, 2, 0),
        )  # fmt: skip

    def run(self, *args: Any) -> tuple["torch.Tensor", ...]:
        q, k, v, _, ones, _, g = args
        out, lse = fused_forward(g.views(q, k, v), g)
        return lse.unsqueeze(-1).expand(ones.shape), ones, g.from_bnsd(out)

    def reference(self, *args: Any) -> tuple["torch.Tensor", ...]:
        import torch

        q, k, v, _, ones, true_stats, g = args
        out, peak, total = math_forward(g.views(*_float64(q, k, v)), g)
        if true_stats:
            return peak.expand(ones.shape), total.expand(ones.shape), g.from_bnsd(out)
        return (peak + total.log()).expand(ones.shape), torch.ones(ones.shape, dtype=torch.float64), g.from_bnsd(out)


class FlashAttentionScoreGradReplay(_AttentionReplay):
    kernel_types = ("FlashAttentionScoreGrad",)
    npu_api = "torch_npu.npu_fusion_attention_grad"
    trace_ops = MappingProxyType(
        {
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _trace_backward(8, 6, 7),
            "aten::_scaled_dot_product_flash_attention_backward": _trace_backward(None, 10, 11),
            "aten::_scaled_dot_product_efficient_attention_backward": _trace_backward(4, 9, 11),
            "aten::_scaled_dot_product_cudnn_attention_backward": _trace_backward(8, 13, 14),
        }
    )

    def check(self, row: KernelRow) -> None:
        grad_geometry(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        import torch

        g = grad_geometry(row)
        q, k, v, dy = (self.random(spec, device, generator) for spec in row.inputs[:4])
        # the forward's outputs for these q/k/v, as the NPU kernel reads them back
        out, peak, total = math_forward(g.views(q.float(), k.float(), v.float()), g)
        stats = (g.batch, g.heads, g.seq_q, STATS_WIDTH)
        attention_in = g.from_bnsd(out).to(q.dtype, memory_format=torch.contiguous_format)
        lse = (peak + total.log()).squeeze(-1).contiguous()  # what the portable kernels take instead
        mask = _compressed_mask(device) if g.causal else None
        smax, ssum = peak.expand(stats).contiguous(), total.expand(stats).contiguous()
        return q, k, v, dy, mask, smax, ssum, attention_in, lse, _backward_aux(q, g), g

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        q, k, v, dy, mask, smax, ssum, attention_in, _, _, g = args
        return self.api_call(
            q, k, v, dy, g.heads, g.layout, atten_mask=mask, softmax_max=smax, softmax_sum=ssum,
            attention_in=attention_in, scale_value=g.scale, keep_prob=1.0, sparse_mode=g.sparse_mode, select=(0, 1, 2),
        )  # fmt: skip

    def run(self, *args: Any) -> tuple["torch.Tensor", ...]:
        q, k, v, dy, _, _, _, attention_in, lse, aux, g = args
        return tuple(g.from_bnsd(t) for t in fused_backward(g.views(q, k, v, dy, attention_in), lse, aux, g))

    def reference(self, *args: Any) -> tuple["torch.Tensor", ...]:
        g = args[-1]
        return tuple(g.from_bnsd(t) for t in math_backward(g.views(*_float64(*args[:4])), g))
