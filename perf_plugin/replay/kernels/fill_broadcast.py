"""Tensors made from a value or a smaller tensor: ``Fill`` and ``BroadcastTo``.

Row layouts (the real Level1 training profile, ``tests/fixtures/ascend/kernel_details_level1.csv``):

* ``Fill``: ``dims [rank] INT64; value`` (a 0-d slot) -> ``y`` (``"1;"`` INT64;FLOAT -> ``"1"``
  FLOAT): every element the value.  API: ``torch.full`` (aclnnInplaceFillScalar's Fill kernel);
* ``BroadcastTo``: ``x; shape [rank] INT64`` -> ``y`` materialised (``"1,32;2"`` -> ``"5,32"``).
  API: ``torch.ops.aten.expand_copy`` (an expand that writes its result, what the kernel does).

Both are exact (values are copied, never computed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels.elementwise import scalar_aware_inputs
from perf_plugin.replay.tensors import KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch


class FillReplay(OpReplay):
    kernel_types = ("Fill",)
    npu_api = "torch.full"

    def check(self, row: KernelRow) -> None:
        inputs, outputs = scalar_aware_inputs(row), row.present_outputs
        if len(inputs) != 2 or len(outputs) != 1 or inputs[0].shape is None or len(inputs[0].shape) != 1:
            raise CaseBuildError("Fill needs dims [rank], a value and one output")
        assert outputs[0].shape is not None
        if inputs[0].shape != (len(outputs[0].shape),):
            raise CaseBuildError(f"Fill dims {shape_text(inputs[0])} do not name the {len(outputs[0].shape)} dims of "
                                 f"{shape_text(outputs[0])}")

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        self.check(row)
        out = row.present_outputs[0]
        return out.shape, 0.75, out.torch_dtype(), device

    def run(self, shape: tuple[int, ...], value: float, dtype: "torch.dtype", device: "torch.device") -> "torch.Tensor":
        import torch

        return torch.full(shape, value, dtype=dtype, device=device)

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0


class BroadcastToReplay(OpReplay):
    kernel_types = ("BroadcastTo",)
    npu_api = "torch.ops.aten.expand_copy"

    def check(self, row: KernelRow) -> None:
        if len(row.inputs) != 2 or len(row.present_outputs) != 1:
            raise CaseBuildError("BroadcastTo needs x, shape and one output")
        x, shape, out = row.inputs[0], row.inputs[1], row.present_outputs[0]
        assert x.shape is not None and out.shape is not None
        padded = (1,) * (len(out.shape) - len(x.shape)) + x.shape
        if len(padded) != len(out.shape) or any(a not in (1, b) for a, b in zip(padded, out.shape)) or x.dtype != out.dtype:
            raise CaseBuildError(f"BroadcastTo {shape_text(x)} {x.dtype} does not broadcast to {shape_text(out)} {out.dtype}")
        if shape.shape != (len(out.shape),):
            raise CaseBuildError(f"BroadcastTo shape slot {shape_text(shape)} does not name {len(out.shape)} dims")

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        self.check(row)
        out = row.present_outputs[0].shape
        assert out is not None
        return self.random(row.inputs[0], device, generator, low=0, high=1000), list(out)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        return self.api_call(*args)

    def run(self, x: "torch.Tensor", shape: list[int]) -> "torch.Tensor":
        import torch

        return torch.ops.aten.expand_copy(x, shape)  # type: ignore[no-any-return]

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0
