"""2-D convolutions of a training step: ``Conv2D``, ``Conv2DBackpropInput``, ``Conv2DBackpropFilter``.

Row layouts (the real Level1 training profile, ``tests/fixtures/ascend/kernel_details_level1.csv``:
14 rows, 20 % of its time), activations in 5HD (``NC1HWC0``) and weights in ``FRACTAL_Z``
(``perf_plugin.replay.kernels._ascend_formats``):

* ``Conv2D``: ``x [N,C1,H,W,C0]; w [C1*Kh*Kw,N1,16,C0]; bias [Cout]`` (optional) -> ``y [N,Co1,Ho,Wo,C0]``;
* ``Conv2DBackpropInput``: ``input_size [4] INT32; w; dy [N,Co1,Ho,Wo,C0]`` -> ``dx [N,C1,H,W,C0]``;
* ``Conv2DBackpropFilter``: ``x; filter_size [4] INT32; dy`` -> ``dw [C1*Kh*Kw,N1,16,C0]`` (FRACTAL_Z).

The channels are the padded counts ``C1 * C0`` (the row does not say how many of them a model
fills; the NPU's cube computes over the padding anyway).  The kernel is square (``Kh*Kw`` from the
weight's first dim and the input's ``C1``); stride and padding, which the row does not record,
are the smallest stride and then the smallest padding that turn the input's height and width
into the output's (``geometry``): AlexNet's first layer, 224 -> 55 with 11x11, gives stride 4,
padding 2, as the model has it.  Dilation 1, one group.

API (op_mapping.yaml maps ``aten.convolution.default`` to Conv2D): ``torch.nn.functional.conv2d``
for Conv2D, ``torch.ops.aten.convolution_backward`` (one of grad input / grad weight asked for)
for the backprops, on tensors in the row's storage formats on the NPU (``NpuFormat``), in NCHW
elsewhere.  The outputs are compared in NCHW, the logical shape the API returns on every device.
Verified against the same calls on float64 CPU copies; a FLOAT convolution within 5e-3: on CUDA
cuDNN computes it in TF32 (``torch.backends.cudnn.allow_tf32``, on by default, as in a model),
whose 10-bit mantissa gives norm-wise errors of about 1e-3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall, NpuFormat
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels._ascend_formats import N0, base_format
from perf_plugin.replay.tensors import KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]
TF32_TOLERANCE = 5e-3


def geometry(size_in: int, size_out: int, kernel: int) -> tuple[int, int] | None:
    """(stride, padding): the smallest stride, then padding in [0, kernel), giving ``size_out``."""
    for stride in range(1, kernel + 1):
        for padding in range(kernel):
            if size_in + 2 * padding >= kernel and (size_in + 2 * padding - kernel) // stride + 1 == size_out:
                return stride, padding
    return None


@dataclass(frozen=True)
class ConvPlan:
    x: Shape  # NCHW, padded channels
    w: Shape  # [Cout, Cin, Kh, Kw]
    y: Shape  # NCHW
    stride: tuple[int, int]
    padding: tuple[int, int]
    bias: bool


def _nchw_of_5hd(spec: TensorSpec, what: str, row: KernelRow) -> Shape:
    if spec.shape is None or len(spec.shape) != 5 or base_format(spec.format) != "NC1HWC0":
        raise CaseBuildError(f"{row.kernel_type} {what} is {shape_text(spec)} {spec.format or 'ND'}; expected "
                             "[N,C1,H,W,C0] NC1HWC0")
    n, c1, h, w, c0 = spec.shape
    return n, c1 * c0, h, w


def conv_plan(row: KernelRow, x: TensorSpec, weight: TensorSpec, dy: TensorSpec, bias: bool) -> ConvPlan:
    """The NCHW problem of a row from its activation, FRACTAL_Z weight and output-side spec."""
    xs, ys = _nchw_of_5hd(x, "the input activation", row), _nchw_of_5hd(dy, "the output activation", row)
    if weight.shape is None or len(weight.shape) != 4 or base_format(weight.format) != "FRACTAL_Z" or weight.shape[2] != N0:
        raise CaseBuildError(f"{row.kernel_type} weight is {shape_text(weight)} {weight.format or 'ND'}; expected "
                             "[C1*Kh*Kw,N1,16,C0] FRACTAL_Z")
    c1kk, n1, _, c0 = weight.shape
    c1 = xs[1] // c0
    area = c1kk // c1 if c1 and c1kk % c1 == 0 else 0
    k = math.isqrt(area)
    if k * k != area or not k or n1 * N0 != ys[1] or xs[0] != ys[0]:
        raise CaseBuildError(f"{row.kernel_type}: weight {shape_text(weight)} does not fit input {shape_text(x)} and "
                             f"output {shape_text(dy)} with a square kernel")
    height, width = geometry(xs[2], ys[2], k), geometry(xs[3], ys[3], k)
    if height is None or width is None:
        raise CaseBuildError(f"{row.kernel_type}: no stride and padding turn {xs[2]}x{xs[3]} into {ys[2]}x{ys[3]} "
                             f"with a {k}x{k} kernel")
    (sh, ph), (sw, pw) = height, width
    return ConvPlan(xs, (ys[1], xs[1], k, k), ys, (sh, sw), (ph, pw), bias)


def _nchw_spec(shape: Shape, dtype: str) -> TensorSpec:
    return TensorSpec(shape, dtype)


class _ConvolutionReplay(OpReplay):
    def tolerance(self, output: TensorSpec) -> float:
        default = super().tolerance(output)
        return max(default, TF32_TOLERANCE) if output.dtype in ("FLOAT", "FLOAT32", "FP32") else default


class Conv2DReplay(_ConvolutionReplay):
    kernel_types = ("Conv2D",)
    npu_api = "torch.nn.functional.conv2d"

    def plan(self, row: KernelRow) -> ConvPlan:
        if len(row.inputs) < 2 or len(row.present_outputs) != 1:
            raise CaseBuildError("Conv2D needs x, weight (and a bias) and one output")
        bias = len(row.inputs) > 2 and row.inputs[2].present
        plan = conv_plan(row, row.inputs[0], row.inputs[1], row.present_outputs[0], bias)
        if bias and row.inputs[2].shape != (plan.y[1],):
            raise CaseBuildError(f"Conv2D bias {shape_text(row.inputs[2])} is not [{plan.y[1]}]")
        return plan

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def expected_outputs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        return (_nchw_spec(self.plan(row).y, row.present_outputs[0].dtype),)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        p = self.plan(row)
        dtype = row.inputs[0].dtype
        x = self.random(_nchw_spec(p.x, dtype), device, generator)
        w = self.random(_nchw_spec(p.w, row.inputs[1].dtype), device, generator).div_(math.sqrt(p.w[1] * p.w[2] * p.w[3]))
        b = self.random(row.inputs[2], device, generator) if p.bias else None
        return x, w, b, p

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        x, w, b, p = args
        return self.api_call(NpuFormat(x, "NC1HWC0"), NpuFormat(w, "FRACTAL_Z"), b, stride=p.stride, padding=p.padding)

    def parameters(self, row: KernelRow, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(t for t in args[1:3] if t is not None)

    def run(self, x: "torch.Tensor", w: "torch.Tensor", b: "torch.Tensor | None", p: ConvPlan) -> "torch.Tensor":
        import torch

        return torch.nn.functional.conv2d(x, w, b, stride=p.stride, padding=p.padding)


class _ConvBackpropReplay(_ConvolutionReplay):
    """Both backprops: ``convolution_backward`` asked for one gradient."""

    npu_api = "torch.ops.aten.convolution_backward"

    def plan(self, row: KernelRow) -> ConvPlan:
        raise NotImplementedError

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        p = self.plan(row)
        dtype = row.present_outputs[0].dtype
        x = self.random(_nchw_spec(p.x, dtype), device, generator)
        w = self.random(_nchw_spec(p.w, dtype), device, generator).div_(math.sqrt(p.w[1] * p.w[2] * p.w[3]))
        dy = self.random(_nchw_spec(p.y, dtype), device, generator)
        return dy, x, w, p

    def _mask(self) -> list[bool]:
        raise NotImplementedError

    def _call_args(self, dy: Any, x: Any, w: Any, p: ConvPlan) -> tuple[Any, ...]:
        return (dy, x, w, None, list(p.stride), list(p.padding), [1, 1], False, [0, 0], 1, self._mask())

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        dy, x, w, p = args
        call = self._call_args(NpuFormat(dy, "NC1HWC0"), NpuFormat(x, "NC1HWC0"), NpuFormat(w, "FRACTAL_Z"), p)
        return self.api_call(*call, select=(self._mask().index(True),))

    def run(self, dy: "torch.Tensor", x: "torch.Tensor", w: "torch.Tensor", p: ConvPlan) -> "torch.Tensor":
        import torch

        grads = torch.ops.aten.convolution_backward(*self._call_args(dy, x, w, p))
        return grads[self._mask().index(True)]  # type: ignore[no-any-return]


class Conv2DBackpropInputReplay(_ConvBackpropReplay):
    kernel_types = ("Conv2DBackpropInput",)

    def plan(self, row: KernelRow) -> ConvPlan:
        if len(row.inputs) < 3 or len(row.present_outputs) != 1:
            raise CaseBuildError("Conv2DBackpropInput needs input_size, weight, dy and one output dx")
        return conv_plan(row, row.present_outputs[0], row.inputs[1], row.inputs[2], False)

    def expected_outputs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        return (_nchw_spec(self.plan(row).x, row.present_outputs[0].dtype),)

    def _mask(self) -> list[bool]:
        return [True, False, False]


class Conv2DBackpropFilterReplay(_ConvBackpropReplay):
    kernel_types = ("Conv2DBackpropFilter",)

    def plan(self, row: KernelRow) -> ConvPlan:
        if len(row.inputs) < 3 or len(row.present_outputs) != 1:
            raise CaseBuildError("Conv2DBackpropFilter needs x, filter_size, dy and one output dw")
        return conv_plan(row, row.inputs[0], row.present_outputs[0], row.inputs[2], False)

    def expected_outputs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        return (_nchw_spec(self.plan(row).w, row.present_outputs[0].dtype),)

    def _mask(self) -> list[bool]:
        return [False, True, False]
