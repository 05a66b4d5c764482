"""Pooling of a CNN's training step: ``MaxPoolWithArgmaxV1``, ``MaxPoolGradWithArgmaxV1``,
``AdaptiveAvgPool3d`` and ``AdaptiveAvgPool3dGrad``.

Row layouts (the real Level1 training profile, ``tests/fixtures/ascend/kernel_details_level1.csv``):

* ``MaxPoolWithArgmaxV1``: ``x [N,C1,H,W,C0]`` NC1HWC0 -> ``y [N,C1,Ho,Wo,C0]; mask`` UINT16
  ``[N,C1,Kh*Kw,ceil(Ho*Wo/16)+1,C0]``: the kernel writes, per window position, a bit mask of
  where the maximum was (not torch's int64 indices); AlexNet's 3x3, stride 2 pools:
  ``"32,4,55,55,16"`` -> ``"32,4,27,27,16;32,4,9,47,16"``;
* ``MaxPoolGradWithArgmaxV1``: ``x; dy [N,C1,Ho,Wo,C0]; mask`` -> ``dx [N,C1,H,W,C0]``;
* ``AdaptiveAvgPool3d``: ``x [N,D,H,W,C]`` (channels last) -> the same output size (AlexNet's
  ``AdaptiveAvgPool2d((6, 6))`` on a 6x6 map, run by the 3-D kernel);
* ``AdaptiveAvgPool3dGrad``: ``dy; x [N,C,D,H,W]`` -> ``dx``, recorded in a folded layout of the
  same element count (``"1,6,6,8192"`` for ``[32,256,1,6,6]``) and compared in x's shape.

Kernel and stride are not recorded: the window is square with ``Kh*Kw`` from the mask, and the
stride the smallest that, without padding, gives the output size (3x3 stride 2 here).  The
portable path is torch's ``max_pool2d_with_indices`` (and its backward, fed the indices of a
forward pass made with the inputs) on the NCHW data; only the pooled values (or gradient) are
compared, in NCHW, the logical shape the API returns: the mask's layout is the NPU's own.  On
the NPU the same aten calls run on tensors in the rows' formats (op-plugin -> these kernels).
Verified against the same calls on float64 CPU copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall, NpuFormat
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels._ascend_formats import base_format
from perf_plugin.replay.tensors import KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]


@dataclass(frozen=True)
class PoolPlan:
    x: Shape  # NCHW
    y: Shape  # NCHW
    kernel: int
    stride: int


def _nchw(spec: TensorSpec, row: KernelRow, what: str) -> Shape:
    if spec.shape is None or len(spec.shape) != 5 or base_format(spec.format) != "NC1HWC0":
        raise CaseBuildError(f"{row.kernel_type} {what} is {shape_text(spec)} {spec.format or 'ND'}; expected NC1HWC0")
    n, c1, h, w, c0 = spec.shape
    return n, c1 * c0, h, w


def pool_plan(row: KernelRow, x: TensorSpec, y: TensorSpec, mask: TensorSpec) -> PoolPlan:
    xs, ys = _nchw(x, row, "x"), _nchw(y, row, "the pooled output")
    if mask.shape is None or mask.dtype != "UINT16" or len(mask.shape) < 3:
        raise CaseBuildError(f"{row.kernel_type} mask is {shape_text(mask)} {mask.dtype}; expected the UINT16 argmax mask")
    area = mask.shape[-3]
    k = math.isqrt(area)
    strides = [s for s in range(1, k + 1) if (xs[2] - k) // s + 1 == ys[2] and (xs[3] - k) // s + 1 == ys[3]]
    if k * k != area or not strides or xs[:2] != ys[:2]:
        raise CaseBuildError(f"{row.kernel_type}: no square window of {area} positions pools {shape_text(x)} into {shape_text(y)}")
    return PoolPlan(xs, ys, k, strides[0])


class MaxPoolWithArgmaxV1Replay(OpReplay):
    kernel_types = ("MaxPoolWithArgmaxV1",)
    npu_api = "torch.ops.aten.max_pool2d_with_indices"

    def plan(self, row: KernelRow) -> PoolPlan:
        outputs = row.present_outputs
        if len(row.inputs) != 1 or len(outputs) != 2:
            raise CaseBuildError("MaxPoolWithArgmaxV1 needs x and the outputs y and mask")
        return pool_plan(row, row.inputs[0], outputs[0], outputs[1])

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def expected_outputs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        return (TensorSpec(self.plan(row).y, row.present_outputs[0].dtype),)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        p = self.plan(row)
        return self.random(TensorSpec(p.x, row.inputs[0].dtype), device, generator), p

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        x, p = args
        return self.api_call(NpuFormat(x, "NC1HWC0"), [p.kernel] * 2, [p.stride] * 2, select=(0,))

    def run(self, x: "torch.Tensor", p: PoolPlan) -> "torch.Tensor":
        import torch

        values, _ = torch.ops.aten.max_pool2d_with_indices(x, [p.kernel] * 2, [p.stride] * 2)
        return values  # type: ignore[no-any-return]


class MaxPoolGradWithArgmaxV1Replay(OpReplay):
    kernel_types = ("MaxPoolGradWithArgmaxV1",)
    npu_api = "torch.ops.aten.max_pool2d_with_indices_backward"

    def plan(self, row: KernelRow) -> PoolPlan:
        if len(row.inputs) != 3 or len(row.present_outputs) != 1:
            raise CaseBuildError("MaxPoolGradWithArgmaxV1 needs x, dy, mask and one output dx")
        return pool_plan(row, row.inputs[0], row.inputs[1], row.inputs[2])

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def expected_outputs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        return (TensorSpec(self.plan(row).x, row.present_outputs[0].dtype),)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        import torch

        p = self.plan(row)
        x = self.random(TensorSpec(p.x, row.inputs[0].dtype), device, generator)
        dy = self.random(TensorSpec(p.y, row.inputs[1].dtype), device, generator)
        _, indices = torch.ops.aten.max_pool2d_with_indices(x, [p.kernel] * 2, [p.stride] * 2)
        return dy, x, p, indices

    def _args(self, dy: Any, x: Any, p: PoolPlan, indices: Any) -> tuple[Any, ...]:
        return dy, x, [p.kernel] * 2, [p.stride] * 2, [0, 0], [1, 1], False, indices

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        dy, x, p, indices = args
        return self.api_call(*self._args(NpuFormat(dy, "NC1HWC0"), NpuFormat(x, "NC1HWC0"), p, indices))

    def run(self, dy: "torch.Tensor", x: "torch.Tensor", p: PoolPlan, indices: "torch.Tensor") -> "torch.Tensor":
        import torch

        return torch.ops.aten.max_pool2d_with_indices_backward(*self._args(dy, x, p, indices))  # type: ignore[no-any-return]


class AdaptiveAvgPool3dReplay(OpReplay):
    """Channels-last ``[N,D,H,W,C]`` in and out: the pooled size is the output's ``D,H,W``."""

    kernel_types = ("AdaptiveAvgPool3d",)
    npu_api = "torch.nn.functional.adaptive_avg_pool3d"

    def check(self, row: KernelRow) -> None:
        x, outputs = row.inputs[0] if row.inputs else TensorSpec(None, ""), row.present_outputs
        if x.shape is None or len(x.shape) != 5 or len(outputs) != 1 or outputs[0].shape is None or len(outputs[0].shape) != 5:
            raise CaseBuildError("AdaptiveAvgPool3d needs one 5-D input [N,D,H,W,C] and one 5-D output")
        if (x.shape[0], x.shape[4]) != (outputs[0].shape[0], outputs[0].shape[4]):
            raise CaseBuildError(f"AdaptiveAvgPool3d {shape_text(x)} -> {shape_text(outputs[0])}: N and C must stay")

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        self.check(row)
        out = row.present_outputs[0].shape
        assert out is not None
        ncdhw = self.random(row.inputs[0], device, generator).permute(0, 4, 1, 2, 3)  # a channels-last view
        return ncdhw, tuple(out[1:4])

    def run(self, x: "torch.Tensor", size: tuple[int, int, int]) -> "torch.Tensor":
        import torch

        return torch.nn.functional.adaptive_avg_pool3d(x, size).permute(0, 2, 3, 4, 1)


class AdaptiveAvgPool3dGradReplay(OpReplay):
    """``dy`` and ``x`` as ``[N,C,D,H,W]`` (the second slot's shape); ``dx`` compared in that
    logical shape, which the row records folded (the same elements)."""

    kernel_types = ("AdaptiveAvgPool3dGrad",)
    npu_api = "torch.ops.aten._adaptive_avg_pool3d_backward"

    def plan(self, row: KernelRow) -> Shape:
        if len(row.inputs) != 2 or len(row.present_outputs) != 1:
            raise CaseBuildError("AdaptiveAvgPool3dGrad needs dy, x and one output dx")
        dy, x, dx = row.inputs[0].shape, row.inputs[1].shape, row.present_outputs[0].shape
        if x is None or len(x) != 5 or dy is None or dx is None or math.prod(dy) != math.prod(x) or math.prod(dx) != math.prod(x):
            raise CaseBuildError(f"AdaptiveAvgPool3dGrad: x {x} must be 5-D with as many elements as dy {dy} and dx {dx} "
                                 "(only same-size pooling is replayed)")
        return x

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def expected_outputs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        return (TensorSpec(self.plan(row), row.present_outputs[0].dtype),)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        x_shape = self.plan(row)
        dy = self.random(TensorSpec(x_shape, row.inputs[0].dtype), device, generator)
        return dy, self.random(TensorSpec(x_shape, row.inputs[1].dtype), device, generator)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        return self.api_call(*args)

    def run(self, dy: "torch.Tensor", x: "torch.Tensor") -> "torch.Tensor":
        import torch

        return torch.ops.aten._adaptive_avg_pool3d_backward(dy, x)  # type: ignore[no-any-return]
