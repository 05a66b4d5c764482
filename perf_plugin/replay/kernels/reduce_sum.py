"""``ReduceSum``: a sum over some axes, the axes passed as a tensor.

Row layout (the real Level1 training profile, ``tests/fixtures/ascend/kernel_details_level1.csv``:
8 rows, e.g. a bias gradient or a loss sum): ``x; axes [A] INT64`` -> ``y``, ``"32;1"`` FLOAT;INT64
-> ``"1"`` FLOAT.  The axes' values are not recorded: they are the ``A`` axes whose removal (or
reduction to 1, ``keep_dims``) turns x's shape into y's, the last ones where several fit.
op_mapping.yaml maps ``aten.sum.dim_IntList`` to ReduceSum; that is the API on every device.
Verified against a float64 sum.
"""

from __future__ import annotations

from itertools import combinations
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import FLOATING, KernelRow, shape_text

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]


def reduced_axes(x: Shape, y: Shape, count: int) -> tuple[tuple[int, ...], bool] | None:
    """(axes, keep_dims) reducing ``x`` to ``y`` over ``count`` axes, the last such axes first."""
    for axes in sorted(combinations(range(len(x)), count), reverse=True):
        kept = tuple(1 if i in axes else d for i, d in enumerate(x))
        if kept == y:
            return axes, True
        if tuple(d for i, d in enumerate(x) if i not in axes) == y:
            return axes, False
    if len(x) == count and y in ((), (1,)):  # every axis: a 0-d result, or [1]
        return tuple(range(count)), y == (1,) and len(x) == 1
    return None


class ReduceSumReplay(OpReplay):
    kernel_types = ("ReduceSum",)
    npu_api = "torch.sum"

    def plan(self, row: KernelRow) -> tuple[tuple[int, ...], bool]:
        if len(row.inputs) != 2 or len(row.present_outputs) != 1:
            raise CaseBuildError("ReduceSum needs x, axes and one output")
        x, axes, y = row.inputs[0], row.inputs[1], row.present_outputs[0]
        assert x.shape is not None and y.shape is not None
        if x.dtype not in FLOATING or axes.shape is None or len(axes.shape) != 1:
            raise CaseBuildError(f"ReduceSum x {shape_text(x)} {x.dtype}, axes {shape_text(axes)}: a floating x and a 1-D axes list")
        found = reduced_axes(x.shape, y.shape, axes.shape[0])
        if found is None:
            raise CaseBuildError(f"ReduceSum: no {axes.shape[0]} axes of {shape_text(x)} reduce to {shape_text(y)}")
        return found

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        axes, keep = self.plan(row)
        return self.random(row.inputs[0], device, generator), list(axes), keep, row.present_outputs[0].torch_dtype()

    def run(self, x: "torch.Tensor", axes: list[int], keep: bool, dtype: "torch.dtype") -> "torch.Tensor":
        import torch

        return torch.sum(x, axes, keepdim=keep, dtype=dtype)

    def reference(self, x: "torch.Tensor", axes: list[int], keep: bool, dtype: "torch.dtype") -> "torch.Tensor":
        import torch

        return torch.sum(x.detach().cpu().double(), axes, keepdim=keep)
