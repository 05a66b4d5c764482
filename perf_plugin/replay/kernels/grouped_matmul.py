"""MoE grouped GEMMs: ``GroupedMatmul`` and ``GroupedMatmulSwigluQuant``.

No public row exists; the layouts are the ones Ascend's replay scripts for the same database parse
(msmodeling ``tools/perf_data_collection/op_replay/GroupedMatmul_run.py``,
``GroupedMatmulSwigluQuant_run.py``) and the kernels' operator definitions.

``GroupedMatmul`` (aclnnGroupedMatmulV4/V5/WeightNz; single x/weight/y tensors, groups along M):
``x [M,K]; weight [E,K,N]; bias; scale; offset; antiquant_scale; antiquant_offset; group_list [E]
INT64; per_token_scale [M]`` -> ``y [M,N]``.  Replayed: float GEMMs (BF16/FLOAT16/FLOAT throughout)
and W8A8 per-token GEMMs (INT8 x, weight; ``scale [E,N]`` BF16/FLOAT; ``per_token_scale`` FLOAT;
``y`` BF16/FLOAT16): ``y = (x @ w_g) * scale_g * per_token_scale``.  The weight may be an
``[E,N,K]`` (transposed) view or a FRACTAL_NZ storage shape ``[E,N/n0,K/k0,k0,n0]``.  Bias, offset,
antiquant and INT64-scale (int8-output) rows are rejected.  Trace ingest: ``aten::_grouped_mm``.

``GroupedMatmulSwigluQuant`` (vllm-ascend ``csrc/gmm/grouped_matmul_swiglu_quant``): ``x [M,K] INT8;
weight [E,K,N] INT8 (NZ storage [E,N/32,K/16,16,32]); weight_scale [E,N]; x_scale [M] FLOAT;
group_list [E] INT64`` (the op definition's optional A8W4 ``weight_assistance_matrix`` may sit
before ``group_list``, empty) -> ``y [M,N/2] INT8; y_scale [M] FLOAT``.  Per the torch_npu doc:
``C = (x_g @ w_g) * x_scale * w_scale_g``, ``S = silu(C[:, :N/2]) * C[:, N/2:]``,
``y_scale = max|S| / 127``, ``y = round_half_even(S / y_scale)`` per row.

The rows per group are the model's where the row records them (``Input Values`` at the group
list's slot: the cumulative end rows an input-value capture took from ``torch._grouped_mm``'s
``offs``, ``perf_plugin.capture``); otherwise they are drawn as even as they can be, sum to ``M``,
and the row's ``Input Values Source`` says ``default: even groups``.  Either way they go to the
API cumulative (``group_list_type=0``, as msmodeling; 1 is counts).
NPU calls: ``npu_grouped_matmul([x], [w], group_list=, split_item=2, group_type=0,
group_list_type=0[, scale=, per_token_scale=, output_dtype=])``; ``npu_grouped_matmul_swiglu_quant(
x, w_nz, group_list, w_scale, x_scale)`` (its third result, ``y_offset``, is not recorded).

Portable path: one ``torch._grouped_mm`` (CPU: BF16/FLOAT16/FLOAT, 16-byte aligned rows; CUDA:
BF16 on sm90+), else a loop of ``mm`` over host-side group sizes; INT8 GEMMs in float32.
SwigluQuant draws ``x``, ``w`` in ``[-8, 8)``: partial sums are integers below 2**24, the float32
GEMM is exact, and with a float64 epilogue ``run`` equals the float64 reference bit for bit
(tolerance 0 for ``y``).  On the NPU (float32 epilogue) ``y`` may differ by one at rounding ties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall, NpuFormat
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels._grouped_gemm import (
    EXACT_INT8_BOUND,
    FLOAT_GEMM,
    QUANT_OUT,
    QUANT_SCALE,
    SWIGLU_SCALE,
    Groups,
    check_group_list,
    EVEN_GROUPS,
    draw_groups,
    group_ends,
    grouped_mm,
    grouped_reference,
    maybe_nz,
    recorded_group_sizes,
    require_empty,
    required_slot,
    swiglu_requant,
    weight_shape,
)
from perf_plugin.replay.tensors import KernelRow, TensorSpec, shape_text
from perf_plugin.trace.args import tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]


# ----------------------------------------------------------------------------- GroupedMatmul
def _trace_grouped_mm(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """``_grouped_mm(x [M,K], w [E,K,N], offs [E])`` (groups along M, no bias) is this kernel's
    float GEMM: ``x;weight;;;;;;group_list`` with the API's INT64 cumulative list (torch's offs
    are int32 cumulative ends)."""
    x, w, offs = tensor_arg(op, 0), tensor_arg(op, 1), tensor_arg(op, 2)
    if x is None or w is None or offs is None or tensor_arg(op, 3) is not None:
        return None
    if x.rank != 2 or w.rank != 3 or offs.shape != (w.shape[0],) or x.shape[1] != w.shape[1]:
        return None
    empty = Slot(None, "")
    inputs = (Slot(x.shape, x.dtype), Slot(w.shape, w.dtype), *(empty,) * 5, Slot(offs.shape, "INT64"))
    values = (None,) * 7 + (op.values[2],) if 2 in op.values else ()  # the groups the model routed
    return MappedOp("GroupedMatmul", inputs, (Slot((x.shape[0], w.shape[2]), x.dtype),), values=values)


@dataclass(frozen=True)
class GmmPlan:
    m: int
    k: int
    n: int
    experts: int
    transposed: bool  # weight stored [E,N,K]
    quant: bool  # W8A8 per-token
    sizes: tuple[int, ...] | None  # rows per group the model routed (None: not recorded)


class GroupedMatmulReplay(OpReplay):
    """``torch_npu.npu_grouped_matmul`` with single x/weight/y tensors and an M-axis group list."""

    kernel_types = ("GroupedMatmul",)
    npu_api = "torch_npu.npu_grouped_matmul"
    data_inputs = MappingProxyType({7: EVEN_GROUPS})
    trace_ops = MappingProxyType({"aten::_grouped_mm": _trace_grouped_mm})
    reference_on_device = True  # a prefill's experts in float64 take minutes on a host

    def plan(self, row: KernelRow) -> GmmPlan:
        x, w = required_slot(row, 0, "x"), required_slot(row, 1, "weight")
        require_empty(row, {2: "bias", 4: "offset", 5: "antiquant_scale", 6: "antiquant_offset"})
        outputs, wshape = row.present_outputs, weight_shape(w)
        y = outputs[0] if len(outputs) == 1 else TensorSpec(None, "")
        assert x.shape is not None
        if len(x.shape) != 2 or len(wshape) != 3 or y.shape is None or len(y.shape) != 2 or y.shape[0] != x.shape[0]:
            raise CaseBuildError(f"{row.kernel_type} needs x [M,K], weight [E,K,N] and one output y [M,N]; got x "
                                 f"{shape_text(x)}, weight {shape_text(w)} ({w.format or 'ND'}), {len(outputs)} output(s)")
        (m, k), n, experts = x.shape, y.shape[1], wshape[0]
        # [E,N,K]: a transposed weight view (the API takes it; an NZ weight is never recorded so)
        transposed = wshape[1:] != (k, n) and wshape[1:] == (n, k) and w.format != "FRACTAL_NZ"
        if wshape[1:] != (k, n) and not transposed:
            raise CaseBuildError(f"{row.kernel_type} weight {shape_text(wshape)} is neither [E,K,N] nor [E,N,K] "
                                 f"for x {shape_text(x)} and y {shape_text(y)}")
        check_group_list(row, 7, experts)
        sizes = recorded_group_sizes(row, 7, experts, m)
        return GmmPlan(m, k, n, experts, transposed, self._quantised(row, x, w, y, m, n, experts), sizes)

    @staticmethod
    def _quantised(row: KernelRow, x: TensorSpec, w: TensorSpec, y: TensorSpec, m: int, n: int, e: int) -> bool:
        """False for a float GEMM, True for a W8A8 per-token one; anything else is rejected."""
        scale = row.inputs[3] if len(row.inputs) > 3 and row.inputs[3].present else None
        pts = row.inputs[8] if len(row.inputs) > 8 and row.inputs[8].present else None
        if x.dtype in FLOAT_GEMM and w.dtype == x.dtype == y.dtype and scale is None and pts is None:
            return False
        if x.dtype == w.dtype == "INT8" and y.dtype in QUANT_OUT:
            if scale is None or scale.shape != (e, n) or scale.dtype not in QUANT_SCALE:
                raise CaseBuildError(f"{row.kernel_type} W8A8 scale (slot 3) is {shape_text(scale)} "
                                     f"{scale.dtype if scale else ''}; only per-channel [{e},{n}] BF16/FLOAT scales are "
                                     "replayed (INT64 scales are the int8-output requantisation)")
            if pts is None or pts.shape != (m,) or pts.dtype != "FLOAT":
                raise CaseBuildError(f"{row.kernel_type} W8A8 per_token_scale (slot 8) is {shape_text(pts)} "
                                     f"{pts.dtype if pts else ''}, expected [{m}] FLOAT")
            return True
        raise CaseBuildError(f"{row.kernel_type} x/weight/y dtypes {x.dtype}/{w.dtype}/{y.dtype}: only float GEMMs "
                             "(one of BF16/FLOAT16/FLOAT throughout) and W8A8 per-token GEMMs (INT8 x and weight, "
                             "BF16/FLOAT16 y) are replayed")

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:

        p = self.plan(row)
        scale: torch.Tensor | None = None
        pts: torch.Tensor | None = None
        stored = (p.experts, p.n, p.k) if p.transposed else (p.experts, p.k, p.n)
        spec = TensorSpec(stored, row.inputs[1].dtype)
        if p.quant:
            x = self.random(row.inputs[0], device, generator, low=-128, high=128)
            w = self.random(spec, device, generator, low=-128, high=128)
            # scales sized like real ones (~1/127 of the data range) keep FLOAT16 outputs finite
            scale = self.random(row.inputs[3], device, generator).abs_().div_(127 * math.sqrt(p.k))
            pts = self.random(row.inputs[8], device, generator).abs_().div_(127)
        elif row.inputs[1].strides is not None:
            # a trace recorded the weight's strides (an [E,N,K] parameter read as [E,K,N]): the
            # GEMM kernel depends on that layout, so the replay reads the very same one
            x, w = self.random(row.inputs[0], device, generator), self.random(row.inputs[1], device, generator)
        else:
            x, w = self.random(row.inputs[0], device, generator), self.random(spec, device, generator)
        if p.transposed and row.inputs[1].strides is None:
            w = w.transpose(1, 2)
        gemm = ("FLOAT" if p.quant else row.inputs[0].dtype, p.k, p.n)  # int8 GEMMs run in float32
        group_list, offsets, groups, rows = draw_groups(p.m, p.experts, gemm, device, generator, p.sizes)
        return x, w, scale, pts, group_list, 0, offsets, groups, rows, row.present_outputs[0]

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        x, w, scale, pts, group_list, list_type, _, _, _, y = args
        kwargs: dict[str, Any] = {
            "group_list": group_list,
            "split_item": 2,  # one output tensor
            "group_type": 0,  # groups along M
            "group_list_type": list_type,
        }
        if scale is not None:
            kwargs.update(scale=[scale], per_token_scale=[pts], output_dtype=y.torch_dtype())
        return self.api_call([x], [maybe_nz(row.inputs[1], w)], select=(0,), **kwargs)

    def parameters(self, row: KernelRow, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The experts' weights, and their scales where the GEMM is quantised."""
        return tuple(value for value in args[1:3] if value is not None)

    def run(
        self, x: "torch.Tensor", w: "torch.Tensor", scale: "torch.Tensor | None", pts: "torch.Tensor | None",
        group_list: "torch.Tensor", list_type: int, offsets: "torch.Tensor", groups: Groups,
        rows: "torch.Tensor | None", y: TensorSpec,
    ) -> "torch.Tensor":
        if scale is None:
            return grouped_mm(x, w, offsets, groups)
        assert pts is not None and rows is not None
        acc = grouped_mm(x.float(), w.float(), offsets, groups)  # int8 values are exact in float32
        return acc.mul_(scale.float().index_select(0, rows)).mul_(pts.unsqueeze(1)).to(y.torch_dtype())

    def reference(
        self, x: "torch.Tensor", w: "torch.Tensor", scale: "torch.Tensor | None", pts: "torch.Tensor | None",
        group_list: "torch.Tensor", list_type: int, offsets: "torch.Tensor", groups: Groups,
        rows: "torch.Tensor | None", y: TensorSpec,
    ) -> "torch.Tensor":
        ends = group_ends(group_list, list_type)
        where = self.reference_device((x,))
        if scale is None or pts is None:
            return grouped_reference(x, w, ends, where=where)
        return grouped_reference(x, w, ends, scale, where) * pts.detach().to(where).double().unsqueeze(1)


# ----------------------------------------------------------------------------- GroupedMatmulSwigluQuant
class GroupedMatmulSwigluQuantReplay(OpReplay):
    """W8A8 grouped GEMM + dequant + SwiGLU + dynamic per-token int8 quant, in one kernel."""

    kernel_types = ("GroupedMatmulSwigluQuant",)
    # Not named by op_mapping for this type (the 0.13.0 file gives it for DequantSwigluQuant);
    # op-plugin's npu_grouped_matmul_swiglu_quant -> aclnnGroupedMatmulSwigluQuantWeightNZ ->
    # l0op GroupedMatmulSwigluQuant is the API whose kernel this is.
    npu_api = "torch_npu.npu_grouped_matmul_swiglu_quant"
    data_inputs = MappingProxyType({4: EVEN_GROUPS, 5: EVEN_GROUPS})

    def plan(self, row: KernelRow) -> tuple[int, int, int, int]:
        """(M, K, N, E)."""
        x, w = required_slot(row, 0, "x"), required_slot(row, 1, "weight")
        ws, xs = required_slot(row, 2, "weight_scale"), required_slot(row, 3, "x_scale")
        group_slot = 5 if len(row.inputs) > 5 and row.inputs[5].present else 4
        if group_slot == 5:
            require_empty(row, {4: "weight_assistance_matrix (A8W4)"})
        assert x.shape is not None
        wshape = weight_shape(w)
        if x.dtype != "INT8" or w.dtype != "INT8" or len(x.shape) != 2 or len(wshape) != 3 or wshape[1] != x.shape[1]:
            raise CaseBuildError(f"{row.kernel_type} needs x [M,K] INT8 and weight [E,K,N] INT8 (A8W8); got x "
                                 f"{shape_text(x)} {x.dtype}, weight {shape_text(w)} {w.dtype} ({w.format or 'ND'})")
        (m, k), (e, _, n) = x.shape, wshape
        if ws.shape != (e, n) or ws.dtype not in SWIGLU_SCALE or xs.shape != (m,) or xs.dtype != "FLOAT":
            raise CaseBuildError(f"{row.kernel_type} needs weight_scale [{e},{n}] FLOAT/BF16/FLOAT16 and x_scale [{m}] "
                                 f"FLOAT; got {shape_text(ws)} {ws.dtype} and {shape_text(xs)} {xs.dtype}")
        check_group_list(row, group_slot, e)
        recorded_group_sizes(row, group_slot, e, m)
        expected = ((m, n // 2), "INT8"), ((m,), "FLOAT")
        got = tuple((s.shape, s.dtype) for s in row.present_outputs)
        if n % 2 or got != expected:
            raise CaseBuildError(f"{row.kernel_type} outputs should be y [{m},{n // 2}] INT8 and y_scale [{m}] FLOAT "
                                 f"(N={n} even); got {'; '.join(f'{shape_text(s)} {d}' for s, d in got)}")
        return m, k, n, e

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        m, k, n, e = self.plan(row)
        bound = EXACT_INT8_BOUND
        x = self.random(row.inputs[0], device, generator, low=-bound, high=bound)
        w = self.random(TensorSpec((e, k, n), "INT8"), device, generator, low=-bound, high=bound)
        # |C| ~ 1: the products of two such ints have a standard deviation of about 21 per term
        unit = 1.0 / math.sqrt(21 * math.sqrt(k))
        ws = self.random(row.inputs[2], device, generator).abs_().mul_(unit)
        xs = self.random(row.inputs[3], device, generator).abs_().mul_(unit)
        recorded = recorded_group_sizes(row, 5 if len(row.inputs) > 5 and row.inputs[5].present else 4, e, m)
        return (x, w, ws, xs, *draw_groups(m, e, ("FLOAT", k, n), device, generator, recorded))

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        x, w, ws, xs, group_list, _, _, _ = args
        # returns (y, y_scale, y_offset); the row records y and y_scale
        return self.api_call(x, NpuFormat(w, "FRACTAL_NZ"), group_list, ws, xs, select=(0, 1))

    def run(
        self, x: "torch.Tensor", w: "torch.Tensor", ws: "torch.Tensor", xs: "torch.Tensor",
        group_list: "torch.Tensor", offsets: "torch.Tensor", groups: Groups, rows: "torch.Tensor",
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        acc = grouped_mm(x.float(), w.float(), offsets, groups).double()  # exact integers
        y, y_scale = swiglu_requant(acc.mul_(ws.double().index_select(0, rows)).mul_(xs.double().unsqueeze(1)))
        return y.to(torch.int8), y_scale.float()

    def reference(
        self, x: "torch.Tensor", w: "torch.Tensor", ws: "torch.Tensor", xs: "torch.Tensor",
        group_list: "torch.Tensor", offsets: "torch.Tensor", groups: Groups, rows: "torch.Tensor",
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Float64 per group from the API's cumulative group list: the integer GEMM is exact
        (its sums stay far below 2**53), the epilogue follows the documented formula."""
        import torch

        ends = group_ends(group_list, 0)
        c = grouped_reference(x, w, ends, ws) * xs.detach().cpu().double().unsqueeze(1)
        y, y_scale = swiglu_requant(c)
        return y.to(torch.int8), y_scale
