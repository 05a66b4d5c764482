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
pse, dropout, explicit masks (values not recorded), prefix, FP8 scales.  The TND layout (a 3-D
query with ``actual_seq_qlen`` / ``actual_seq_kvlen`` ``[B]`` in slots 8 and 9: packed requests of
unequal lengths, the lengths in ``Input Values``) is replayed by
``perf_plugin.replay.kernels._flash_varlen``.

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
A varlen call (``torch_attn::_varlen_attn``, which ``torch.nn.attention.varlen.varlen_attn``
calls, or ``aten::_flash_attention_forward`` with ``cum_seq_q``) becomes a TND forward row, its
``cu_seq`` offsets recorded by an input-value capture as the row's lengths; paged KV
(``block_table``, ``seqused_k``), sliding windows and ALiBi are left to the operator's own row.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import OpReplay
from perf_plugin.replay.tensors import DTYPES, KernelRow, TensorSpec
from perf_plugin.trace.args import Tensor, concrete_arg, tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot, TraceMapper

if TYPE_CHECKING:
    import torch
from perf_plugin.replay.kernels._flash_varlen import (
    EVEN_LENGTHS,
    KV_LENS,
    Q_LENS,
    VarlenPlan,
    is_varlen,
    offsets,
    varlen_forward,
    varlen_plan,
    varlen_reference,
)
from perf_plugin.replay.kernels._flash_attention_math import (
    COMPRESSED_MASK,
    HALF_TOLERANCE,
    STATS_WIDTH,
    backward_aux,
    compressed_mask,
    dispatched_forward,
    float64_copies,
    forward_geometry,
    fused_backward,
    fused_forward,
    grad_geometry,
    math_backward,
    math_forward,
    records_stats,
)


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
    # SDPA returns the model attention_out alone: the stats slots stay empty (no kernel wrote them)
    no_stats = Slot(None, "FLOAT")
    return MappedOp("FlashAttentionScore", inputs, (no_stats, no_stats, none, qs))


def _trace_sdpa(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """``scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)``."""
    operands = _sdpa_operands(op, 3, 4, 0)
    return None if operands is None else _row(*operands, concrete_arg(op, 5) is True, grad=False)


# Argument positions of the two varlen operators: (is_causal, window sizes, inputs that must be
# absent, dropout_p) in ``torch_attn::_varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k,
# is_causal, scale, window_size, enable_gqa, seqused_k, block_table, num_splits)`` and
# ``aten::_flash_attention_forward(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
# is_causal, return_debug_mask, scale, window_size_left, window_size_right, seqused_k,
# alibi_slopes, block_table, num_splits)``.
_VARLEN_ATTN = (7, (9,), (11, 12), None)
_FLASH_FORWARD = (8, (11, 12), (13, 14, 15), 7)


def _cumulative_ends(values: tuple[int, ...] | None, batch: int, total: int) -> tuple[int, ...] | None:
    """A captured ``cu_seq`` ([0, e1 .. eB]) as the row's cumulative ends, None where it is not one."""
    if values is None or len(values) != batch + 1 or values[0] != 0 or values[-1] != total:
        return None
    return tuple(values[1:]) if all(a <= b for a, b in zip(values, values[1:])) else None


def _window(op: TraceOp, positions: tuple[int, ...]) -> tuple[int, int] | None:
    """(left, right) of the call's attention window, (-1, -1) where none is given."""
    given: list[object] = []
    for position in positions:
        value = concrete_arg(op, position)
        if isinstance(value, list):
            given.extend(value)
        else:  # one side of two, or the pair not given (``window_size=None``)
            given.extend([value] if len(positions) > 1 else [None, None])
    window = [v for v in (-1 if v is None else v for v in given) if isinstance(v, int)]
    return (window[0], window[1]) if len(window) == len(given) == 2 else None


def _trace_varlen(positions: tuple[int, tuple[int, ...], tuple[int, ...], int | None]) -> TraceMapper:
    """A varlen attention call (packed ``[T, N, D]`` requests, ``cu_seq`` offsets) -> a TND row.
    A window of (-1, 0) is the causal mask (``varlen_attn``'s ``window_size=(-1, 0)``)."""
    causal_at, windows, absent, dropout = positions

    def mapper(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
        q, k, v, cu_q, cu_k = (tensor_arg(op, i) for i in range(5))
        if q is None or k is None or v is None or cu_q is None or cu_k is None or q.rank != 3 or v.shape != k.shape:
            return None
        window = _window(op, windows)
        if any(tensor_arg(op, i) is not None for i in absent) or window not in ((-1, -1), (-1, 0)):
            return None  # paged KV (block_table, seqused_k), ALiBi and sliding windows are other kernels
        if dropout is not None and concrete_arg(op, dropout) not in (None, 0, 0.0):
            return None
        if cu_q.rank != 1 or cu_k.shape != cu_q.shape or cu_q.shape[0] < 2:
            return None
        batch = cu_q.shape[0] - 1
        mapped = _row(q, k, concrete_arg(op, causal_at) is True or window == (-1, 0), grad=False)
        lengths = Slot((batch,), "INT64")
        inputs = (*mapped.inputs[:Q_LENS], lengths, lengths, *mapped.inputs[KV_LENS + 1:])
        q_ends = _cumulative_ends(op.values.get(3), batch, q.shape[0])
        kv_ends = _cumulative_ends(op.values.get(4), batch, k.shape[0])
        values = (None,) * Q_LENS + (q_ends, kv_ends) if q_ends is not None and kv_ends is not None else ()
        return MappedOp(mapped.kernel_type, inputs, mapped.outputs, values=values)

    return mapper


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
    trace_ops = MappingProxyType({
        "aten::scaled_dot_product_attention": _trace_sdpa,
        "torch_attn::_varlen_attn": _trace_varlen(_VARLEN_ATTN),
        "aten::_flash_attention_forward": _trace_varlen(_FLASH_FORWARD),
    })  # fmt: skip
    # TND rows: each request's cumulative end (perf_plugin.replay.kernels._flash_varlen)
    data_inputs = MappingProxyType({Q_LENS: EVEN_LENGTHS, KV_LENS: EVEN_LENGTHS})
    # the TND reference computes where its float64 copies fit (CUDA); the other layouts' on the host
    reference_on_device = True

    def check(self, row: KernelRow) -> None:
        varlen_plan(row) if is_varlen(row) else forward_geometry(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        import torch

        if is_varlen(row):
            return self._varlen_inputs(row, device, generator)
        g = forward_geometry(row)
        q, k, v = (self.random(spec, device, generator) for spec in row.inputs[:3])
        # softmax_sum of the (lse, 1) pair, made once so that run launches no kernel for it
        ones: torch.Tensor | None = None
        if records_stats(row):
            ones = torch.ones(1, 1, 1, 1, device=device).expand(g.batch, g.heads, g.seq_q, STATS_WIDTH)
        # on an NPU the outputs are the kernel's own (max, sum) pair: the reference gives that one
        return q, k, v, compressed_mask(device) if g.causal else None, ones, device.type == "npu", g

    def _varlen_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        import torch

        plan = varlen_plan(row)
        q, k, v = (self.random(spec, device, generator) for spec in row.inputs[:3])
        ones = torch.ones(1, 1, 1, device=device).expand(plan.tokens, plan.heads, STATS_WIDTH) if plan.stats else None
        mask = compressed_mask(device) if plan.causal else None
        cu = offsets(plan, device) if device.type == "cuda" else None
        return q, k, v, mask, ones, device.type == "npu", plan, cu

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        q, k, v, mask, ones, _, g = args[:7]
        if isinstance(g, VarlenPlan):
            return self.api_call(
                q, k, v, g.heads, "TND", atten_mask=mask, scale=g.scale, keep_prob=1.0, sparse_mode=g.sparse_mode,
                actual_seq_qlen=g.q_ends, actual_seq_kvlen=g.kv_ends, select=(1, 2, 0) if ones is not None else (0,),
            )  # fmt: skip
        return self.api_call(
            q, k, v, g.heads, g.layout, atten_mask=mask, scale=g.scale, keep_prob=1.0, sparse_mode=g.sparse_mode,
            select=(1, 2, 0) if ones is not None else (0,),
        )  # fmt: skip

    def expected_outputs(self, row: KernelRow) -> Sequence[TensorSpec]:
        return row.present_outputs  # attention_out alone for a row from a PyTorch trace

    def run(self, *args: Any) -> "tuple[torch.Tensor, ...] | torch.Tensor":
        q, k, v, _, ones, _, g = args[:7]
        if isinstance(g, VarlenPlan):
            out, lse = varlen_forward(q, k, v, g, args[7])
            return out if ones is None else (lse.unsqueeze(-1).expand(ones.shape), ones, out)
        if ones is None:  # no stats recorded: the model's own SDPA dispatch, attention_out alone
            return dispatched_forward(g.views(q, k, v), g)
        out, lse = fused_forward(g.views(q, k, v), g)
        return lse.unsqueeze(-1).expand(ones.shape), ones, g.from_bnsd(out)

    def reference(self, *args: Any) -> "tuple[torch.Tensor, ...] | torch.Tensor":
        import torch

        q, k, v, _, ones, true_stats, g = args[:7]
        if isinstance(g, VarlenPlan):  # a packed prefill's float64 attention takes minutes on a host
            out, peak, total = varlen_reference(q, k, v, g, None if true_stats else self.reference_device(args[:3]))
            peak, total = peak.unsqueeze(-1), total.unsqueeze(-1)
        else:
            bnsd, peak, total = math_forward(g.views(*float64_copies(q, k, v)), g)
            out = g.from_bnsd(bnsd)
        if ones is None:
            return out
        if true_stats:
            return peak.expand(ones.shape), total.expand(ones.shape), out
        return (peak + total.log()).expand(ones.shape), torch.ones(ones.shape, dtype=torch.float64), out


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
        mask = compressed_mask(device) if g.causal else None
        smax, ssum = peak.expand(stats).contiguous(), total.expand(stats).contiguous()
        return q, k, v, dy, mask, smax, ssum, attention_in, lse, backward_aux(q, g), g

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
        return tuple(g.from_bnsd(t) for t in math_backward(g.views(*float64_copies(*args[:4])), g))
