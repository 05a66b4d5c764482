"""A classifier's loss and its gradient: ``LogSoftmaxV2``, ``LogSoftmaxGrad``, ``NLLLoss``, ``NLLLossGrad``.

Row layouts (the real Level1 training profile, ``tests/fixtures/ascend/kernel_details_level1.csv``:
a CNN's cross-entropy over 1000 classes, batch 32):

* ``LogSoftmaxV2``: ``x [B,C]`` -> ``y [B,C]``, over the last dim;
* ``LogSoftmaxGrad``: ``dy [B,C]; y [B,C]`` -> ``dx [B,C]`` (``dy - exp(y) * sum(dy)``);
* ``NLLLoss``: ``x [B,C]; target [B] INT64; weight [C]`` -> ``loss; total_weight`` (0-d FLOAT
  each, written as empty shapes with dtypes), mean reduction;
* ``NLLLossGrad``: ``x [B,C]; dloss (0-d); target [B] INT32; weight [C]; total_weight (0-d)`` -> ``dx [B,C]``.

The reduction (mean, what ``cross_entropy`` uses by default) and ``ignore_index`` (-100) are
attributes the rows do not record.  API on every device: the aten operators op-plugin maps to
these kernels (``_log_softmax``, ``_log_softmax_backward_data``, ``nll_loss_forward``,
``nll_loss_backward``); a target the NPU kernel reads as INT32 is passed as torch's INT64.
Targets are drawn in ``[0, C)``.  Verified against the same calls on float64 CPU copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels.elementwise import scalar_aware_inputs, scalar_aware_outputs
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

MEAN = 1  # at::Reduction::Mean
IGNORE_INDEX = -100


def _matrix(row: KernelRow, spec: TensorSpec, what: str) -> tuple[int, int]:
    if spec.shape is None or len(spec.shape) != 2 or spec.dtype not in FLOATING:
        raise CaseBuildError(f"{row.kernel_type} {what} is {shape_text(spec)} {spec.dtype}; expected a floating [B,C]")
    return spec.shape[0], spec.shape[1]


class LogSoftmaxV2Replay(OpReplay):
    kernel_types = ("LogSoftmaxV2",)
    npu_api = "torch.ops.aten._log_softmax"

    def check(self, row: KernelRow) -> None:
        if len(row.inputs) != 1 or len(row.present_outputs) != 1 or row.inputs[0].shape != row.present_outputs[0].shape:
            raise CaseBuildError("LogSoftmaxV2 needs one input and one output of its shape")
        _matrix(row, row.inputs[0], "x")

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        self.check(row)
        return (self.random(row.inputs[0], device, generator).mul_(8),)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> Any:
        return self.api_call(args[0], -1, False)

    def run(self, x: "torch.Tensor") -> "torch.Tensor":
        import torch

        return torch.ops.aten._log_softmax(x, -1, False)  # type: ignore[no-any-return]


class LogSoftmaxGradReplay(OpReplay):
    kernel_types = ("LogSoftmaxGrad",)
    npu_api = "torch.ops.aten._log_softmax_backward_data"

    def check(self, row: KernelRow) -> None:
        if len(row.inputs) != 2 or len(row.present_outputs) != 1:
            raise CaseBuildError("LogSoftmaxGrad needs dy, y and one output dx")
        shapes = {_matrix(row, row.inputs[0], "dy"), _matrix(row, row.inputs[1], "y"), _matrix(row, row.present_outputs[0], "dx")}
        if len(shapes) != 1:
            raise CaseBuildError("LogSoftmaxGrad: dy, y and dx differ in shape")

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        self.check(row)
        dy = self.random(row.inputs[0], device, generator)
        y = self.random(row.inputs[1], device, generator).mul_(8).log_softmax(-1)  # a real log-softmax output
        return dy, y

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> Any:
        dy, y = args
        return self.api_call(dy, y, -1, dy.dtype)

    def run(self, dy: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
        import torch

        return torch.ops.aten._log_softmax_backward_data(dy, y, -1, dy.dtype)  # type: ignore[no-any-return]


class NLLLossReplay(OpReplay):
    kernel_types = ("NLLLoss",)
    npu_api = "torch.ops.aten.nll_loss_forward"

    def plan(self, row: KernelRow) -> tuple[int, int]:
        inputs, outputs = scalar_aware_inputs(row), scalar_aware_outputs(row)
        if len(inputs) != 3 or len(outputs) != 2 or any(o.shape != () for o in outputs):
            raise CaseBuildError("NLLLoss needs x, target, weight and the 0-d loss and total weight")
        b, c = _matrix(row, inputs[0], "x")
        if inputs[1].shape != (b,) or inputs[2].shape != (c,):
            raise CaseBuildError(f"NLLLoss target {shape_text(inputs[1])} / weight {shape_text(inputs[2])} do not fit [{b},{c}]")
        return b, c

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def expected_outputs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        return scalar_aware_outputs(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        b, c = self.plan(row)
        x = self.random(row.inputs[0], device, generator).log_softmax(-1)
        target = self.random(TensorSpec((b,), "INT64"), device, generator, low=0, high=c)
        return x, target, self.random(row.inputs[2], device, generator)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> Any:
        return self.api_call(*args, MEAN, IGNORE_INDEX)

    def run(self, x: "torch.Tensor", target: "torch.Tensor", weight: "torch.Tensor") -> tuple["torch.Tensor", ...]:
        import torch

        return tuple(torch.ops.aten.nll_loss_forward(x, target, weight, MEAN, IGNORE_INDEX))


class NLLLossGradReplay(OpReplay):
    kernel_types = ("NLLLossGrad",)
    npu_api = "torch.ops.aten.nll_loss_backward"

    def plan(self, row: KernelRow) -> tuple[int, int]:
        inputs = scalar_aware_inputs(row)
        if len(inputs) != 5 or len(row.present_outputs) != 1:
            raise CaseBuildError("NLLLossGrad needs x, dloss, target, weight, total_weight and one output dx")
        b, c = _matrix(row, inputs[0], "x")
        if inputs[1].shape != () or inputs[2].shape != (b,) or inputs[3].shape != (c,) or inputs[4].shape != ():
            raise CaseBuildError(f"NLLLossGrad slots do not fit x [{b},{c}]")
        return b, c

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        import torch

        b, c = self.plan(row)
        x = self.random(row.inputs[0], device, generator).log_softmax(-1)
        dloss = torch.ones((), dtype=x.dtype, device=device)
        target = self.random(TensorSpec((b,), "INT64"), device, generator, low=0, high=c)  # torch's INT64
        weight = self.random(TensorSpec((c,), row.inputs[0].dtype), device, generator)
        total = weight.gather(0, target).sum()
        return dloss, x, target, weight, total

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> Any:
        dloss, x, target, weight, total = args
        return self.api_call(dloss, x, target, weight, MEAN, IGNORE_INDEX, total)

    def run(self, dloss: "torch.Tensor", x: "torch.Tensor", target: "torch.Tensor", weight: "torch.Tensor",
            total: "torch.Tensor") -> "torch.Tensor":
        import torch

        return torch.ops.aten.nll_loss_backward(dloss, x, target, weight, MEAN, IGNORE_INDEX, total)  # type: ignore[no-any-return]
