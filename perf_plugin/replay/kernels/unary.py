"""Unary elementwise replays: ``Sin``, ``Cos`` (rotary embeddings), ``Abs`` and ``Relu``.

Row layout (the real Level2 training profile, CANN 8.3): one input ``x`` and one output of the
same shape, ``"4096,1,1,128"`` FLOAT -> ``"4096,1,1,128"`` FLOAT for ``Sin`` / ``Cos`` (the
rotary-embedding tables: ``aclnnSin_SinAiCore_Sin``, ``aclnnCos_CosAiCore_Cos``) and ``""`` FLOAT
-> ``""`` FLOAT for ``Abs`` (a 0-d tensor, written as an empty shape with a dtype:
``aclnnAbs_AbsAiCore_Abs``, the ``abs`` of the gradient norm that an ``isinf`` check compares
with infinity).  0-d slots are read as shape ``()`` (``elementwise.scalar_aware_inputs``).

APIs: the kernel names carry the aclnn operators, which op-plugin reaches from the plain torch
operators (``abs``/``sin``/``cos`` -> ``aclnnAbs``/``aclnnSin``/``aclnnCos``), so ``npu_api``
is ``torch.sin`` / ``torch.cos`` / ``torch.abs`` and ``run`` is that call on every device.
``Sin``/``Cos`` of an integer input give FLOAT (torch's rule); ``Abs`` keeps the dtype.

Verification: ``Sin``/``Cos`` against float64 (default tolerances); ``Abs`` exactly, since
``|x|`` of any value is representable in the input's dtype.

Trace ingest: ``aten::sin``, ``aten::cos`` and ``aten::abs`` become rows of this layout.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.elementwise import ScalarAwareReplay, one_input_one_output
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text
from perf_plugin.trace.args import DEFAULT_FLOAT, category, tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot, TraceMapper

if TYPE_CHECKING:
    import torch

INTEGER_DTYPES = frozenset({"INT8", "UINT8", "INT16", "INT32", "INT64"})


def _trace_unary(kernel_type: str, float_result: bool) -> TraceMapper:
    """``x -> y`` of x's shape; an integer input of a floating-result op gives FLOAT."""

    def mapper(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
        x = tensor_arg(op, 0)
        if x is None or not x.dtype or len(op.types) > 1:
            return None  # ``abs.out`` and other overloads with more arguments are not this row
        dtype = x.dtype
        if float_result and category(dtype) in (0, 1):
            dtype = DEFAULT_FLOAT
        return MappedOp(kernel_type, (Slot(x.shape, x.dtype),), (Slot(x.shape, dtype),))

    return mapper


class _UnaryReplay(ScalarAwareReplay):
    """One input, one output of its shape; ``function`` names the torch operator."""

    function: ClassVar[str] = ""
    # Whether an integer input gives a FLOAT result (``sin``) or keeps its dtype (``abs``).
    float_result: ClassVar[bool] = True

    def operands(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec]:
        x, out = one_input_one_output(row)
        if out.shape != x.shape:
            raise CaseBuildError(f"{row.kernel_type} output {shape_text(out)} differs from the input {shape_text(x)}")
        expected = x.dtype
        if self.float_result and x.dtype in INTEGER_DTYPES:
            expected = "FLOAT"
        elif x.dtype not in FLOATING and x.dtype not in INTEGER_DTYPES:
            raise CaseBuildError(f"{row.kernel_type} input dtype {x.dtype} is neither floating nor integer")
        if out.dtype != expected:
            raise CaseBuildError(
                f"{row.kernel_type} output dtype {out.dtype} should be {expected} for an input of dtype {x.dtype}"
            )
        return x, out

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        x, _ = self.operands(row)
        # Integers: signed values so that ``abs`` has work to do on both signs.
        low = -50 if x.dtype in INTEGER_DTYPES - {"UINT8"} else 1
        return (self.random(x, device, generator, low=low, high=50),)

    def run(self, x: "torch.Tensor") -> "torch.Tensor":
        import torch

        result: torch.Tensor = getattr(torch, self.function)(x)
        return result


class SinReplay(_UnaryReplay):
    kernel_types = ("Sin",)
    npu_api = "torch.sin"
    function = "sin"
    trace_ops = MappingProxyType({"aten::sin": _trace_unary("Sin", True)})


class CosReplay(_UnaryReplay):
    kernel_types = ("Cos",)
    npu_api = "torch.cos"
    function = "cos"
    trace_ops = MappingProxyType({"aten::cos": _trace_unary("Cos", True)})


class AbsReplay(_UnaryReplay):
    kernel_types = ("Abs",)
    npu_api = "torch.abs"
    function = "abs"
    float_result = False
    trace_ops = MappingProxyType({"aten::abs": _trace_unary("Abs", False)})

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0  # |x| is exact in every dtype: the float64 reference rounds back to the same value


class ReluReplay(_UnaryReplay):
    """``Relu`` (real Level1 rows ``"32,64,55,55"`` FLOAT NCHW -> the same): ``torch.relu``,
    aclnnRelu on the NPU; exact (max(x, 0) rounds to itself)."""

    kernel_types = ("Relu",)
    npu_api = "torch.relu"
    function = "relu"
    float_result = False

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        x, _ = self.operands(row)
        return (self.random(x, device, generator).sub_(0.5),)  # both signs: half the elements clamped

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0
