"""Activation replays: ``SwiGlu`` and ``SoftmaxV2``.

``SwiGlu`` (``torch_npu.npu_swiglu(x, dim)``) splits ``x`` in two halves ``A, B`` along ``dim``
and returns ``silu(A) * B``; ``dim`` is an attribute the row does not record, so it is the one
dimension the output halves.  Its portable ``run`` is that formula (two kernels on CUDA); on an
NPU the replay calls ``npu_swiglu`` itself, which launches the ``SwiGlu`` kernel.
``SoftmaxV2`` (``aclnnSoftmax``) records no axis either; it is replayed over the last dimension,
where every LLM softmax (attention, MoE routing, sampling) runs, its logits masked as the row's
``Profiling Input Masked Shares`` says (``perf_plugin.replay.value_draws.with_masked_runs``).
"""

from __future__ import annotations

from abc import abstractmethod
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text
from perf_plugin.replay.value_draws import recorded_masked_shares, with_masked_runs
from perf_plugin.trace.args import SCALAR_TYPE_CODES, concrete_arg, tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot

if TYPE_CHECKING:
    import torch


def _single(row: KernelRow) -> tuple[TensorSpec, TensorSpec]:
    """The one input and one output of a unary op."""
    if len(row.inputs) < 1 or not row.inputs[0].present or any(s.present for s in row.inputs[1:]):
        raise CaseBuildError(
            f"{row.kernel_type} needs exactly one input, got " + ";".join(shape_text(s) for s in row.inputs)
        )
    outputs = row.present_outputs
    if len(outputs) != 1:
        raise CaseBuildError(f"{row.kernel_type} needs exactly one output, got {len(outputs)}")
    x, out = row.inputs[0], outputs[0]
    if x.dtype not in FLOATING:
        raise CaseBuildError(f"{row.kernel_type} needs a floating input, got {x.dtype}")
    return x, out


def swiglu_dim(x: tuple[int, ...], out: tuple[int, ...]) -> int | None:
    """The dimension that ``out`` halves (None unless exactly one dim differs, by a factor of 2)."""
    if len(x) != len(out):
        return None
    differing = [d for d in range(len(x)) if x[d] != out[d]]
    if len(differing) != 1 or x[differing[0]] != 2 * out[differing[0]]:
        return None
    return differing[0]


class SwiGluDimReplay(OpReplay):
    """``SwiGlu`` and its gradient: ``dim``, which the row does not record, is the one dimension
    its shapes halve (finding it is the row's check), and the NPU call takes the row's tensors,
    then ``dim=`` (``make_inputs`` returns them in that order)."""

    @abstractmethod
    def dim(self, row: KernelRow) -> int:
        """The halved dimension; CaseBuildError for a row that cannot be replayed."""

    def check(self, row: KernelRow) -> None:
        self.dim(row)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        *tensors, dim = args
        return self.api_call(*tensors, dim=dim)


class SwiGluReplay(SwiGluDimReplay):
    kernel_types = ("SwiGlu",)
    npu_api = "torch_npu.npu_swiglu"

    def dim(self, row: KernelRow) -> int:
        x, out = _single(row)
        assert x.shape is not None and out.shape is not None
        dim = swiglu_dim(x.shape, out.shape)
        if dim is None:
            raise CaseBuildError(
                f"{row.kernel_type} output {shape_text(out)} is not the input {shape_text(x)} halved along one dimension"
            )
        if out.dtype != x.dtype:
            raise CaseBuildError(
                f"{row.kernel_type} output dtype {out.dtype} differs from the input dtype {x.dtype}"
            )
        return dim

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        dim = self.dim(row)
        x, _ = _single(row)
        return self.random(x, device, generator), dim

    def run(self, x: "torch.Tensor", dim: int) -> "torch.Tensor":
        import torch

        a, b = x.chunk(2, dim)
        return torch.nn.functional.silu(a).mul_(b)


def _trace_softmax(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """Softmax keeps the input's shape; its dtype is the ``dtype`` argument's (``_softmax``:
    ``half_to_float``), else the input's."""
    x = tensor_arg(op, 0)
    if x is None:
        return None
    dtype = x.dtype
    option = concrete_arg(op, 2)
    if op.name == "aten::_softmax":
        if option is True:
            dtype = "FLOAT"
    elif isinstance(option, int) and not isinstance(option, bool) and option in SCALAR_TYPE_CODES:
        dtype = SCALAR_TYPE_CODES[option]
    return MappedOp("SoftmaxV2", (Slot(x.shape, x.dtype),), (Slot(x.shape, dtype),))


class SoftmaxReplay(OpReplay):
    """Softmax over the last dim; a FLOAT output of a half input is produced by the same kernel
    (``softmax(dim, dtype=float32)`` reads half and writes float)."""

    kernel_types = ("SoftmaxV2",)
    npu_api = "torch.softmax"
    masked_inputs = (0,)  # masked logits take the slower exponential (``make_inputs`` masks them)
    trace_ops = MappingProxyType({"aten::softmax": _trace_softmax, "aten::_softmax": _trace_softmax})

    def output_dtype(self, row: KernelRow) -> str | None:
        """None when the output keeps the input dtype, else the float32 output of a half input."""
        x, out = _single(row)
        if out.shape != x.shape:
            raise CaseBuildError(f"{row.kernel_type} output {shape_text(out)} differs from the input {shape_text(x)}")
        if out.dtype == x.dtype:
            return None
        if out.dtype in ("FLOAT", "FLOAT32") and x.dtype in ("FLOAT16", "BF16", "FP16", "HALF", "BFLOAT16"):
            return out.dtype
        raise CaseBuildError(
            f"{row.kernel_type} output dtype {out.dtype} is not producible from input {x.dtype}"
        )

    def check(self, row: KernelRow) -> None:
        self.output_dtype(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        wide = self.output_dtype(row)
        x, out = _single(row)
        masked = recorded_masked_shares(row)  # a mask's share and runs, where a capture recorded them
        values = with_masked_runs(self.random(x, device, generator), masked[0] if masked else None, generator)
        return values, -1, out.torch_dtype() if wide else None

    def run(self, x: "torch.Tensor", dim: int, dtype: "torch.dtype | None") -> "torch.Tensor":
        return x.softmax(dim) if dtype is None else x.softmax(dim, dtype=dtype)

    def reference(self, x: "torch.Tensor", dim: int, dtype: "torch.dtype | None") -> "torch.Tensor":
        return x.detach().to("cpu").double().softmax(dim)


class ReluGradReplay(OpReplay):
    """``ReluGrad`` (real Level1 rows ``"32,4096;32,4096"`` FLOAT -> ``"32,4096"``): ``dy; y`` ->
    ``dx = dy * (y > 0)``, ``threshold_backward(dy, y, 0)`` on every device (op-plugin -> ReluGrad);
    exact."""

    kernel_types = ("ReluGrad",)
    npu_api = "torch.ops.aten.threshold_backward"

    def check(self, row: KernelRow) -> None:
        if len(row.inputs) != 2 or len(row.present_outputs) != 1:
            raise CaseBuildError("ReluGrad needs dy, y and one output dx")
        dy, y, dx = row.inputs[0], row.inputs[1], row.present_outputs[0]
        if not dy.shape == y.shape == dx.shape or not dy.dtype == y.dtype == dx.dtype:
            raise CaseBuildError(f"ReluGrad dy {shape_text(dy)}, y {shape_text(y)}, dx {shape_text(dx)}: one shape and dtype")

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        self.check(row)
        return self.random(row.inputs[0], device, generator), self.random(row.inputs[1], device, generator).sub_(0.5)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        return self.api_call(*args, 0)

    def run(self, dy: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
        import torch

        return torch.ops.aten.threshold_backward(dy, y, 0)  # type: ignore[no-any-return]

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0
