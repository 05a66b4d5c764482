"""Binary replays with a scalar operand: ``Equal``, ``NotEqual``, ``Greater`` and ``Pows``.

Row layout (the real Level2 training profile, CANN 8.3): ``x;other -> out``.  A 0-d tensor or a
host scalar is an empty shape slot that keeps its dtype, so ``";"`` FLOAT;FLOAT is two 0-d
operands and ``"4;"`` a ``[4]`` tensor and a scalar.  The kernel names carry the aclnn operator:

* ``Equal`` ``";"`` FLOAT;FLOAT -> ``""`` BOOL: ``aclnnEqScalar`` (a 0-d tensor against a scalar,
  the ``== inf`` of an ``isinf`` check on the gradient norm);
* ``NotEqual`` ``";"`` FLOAT;FLOAT -> ``""`` BOOL: ``aclnnNeTensor`` (``x != x``, a NaN check);
* ``Greater`` ``"4;"`` FLOAT;FLOAT -> ``"4"`` BOOL: ``aclnnGtScalar``;
* ``Pows`` ``";"`` FLOAT;FLOAT -> ``""`` FLOAT: ``aclnnPowTensorScalar``, a tensor base and a
  scalar exponent (a gradient norm raised to ``norm_type`` in gradient clipping).

The profile does not say whether an empty second slot was a host scalar or a 0-d tensor, and
both launch the same kernel type (``aclnnEqScalar`` and ``aclnnEqTensor`` both run ``Equal``), so
the replay passes it as a host scalar (the ``Scalar`` overloads of two of the three real rows).
A second slot with a shape is a tensor (broadcast with ``x``).  The scalar's value is not
recorded: ``Pows`` uses the exponent 2.0 (the L2 norm squared); comparisons draw it from the
case's seed and write it into the first element of ``x`` (``Equal``/``NotEqual``) so that the
boolean output has both values and the exact verification can tell a wrong operator.

APIs: ``torch.eq`` / ``torch.ne`` / ``torch.gt`` / ``torch.pow`` (op-plugin maps ``eq``/``ne``/
``gt`` to ``aclnnEq*``/``aclnnNe*``/``aclnnGt*`` and ``pow.Tensor_Scalar`` to
``aclnnPowTensorScalar``), and ``run`` is that call everywhere.  Comparisons are verified exactly
against the same comparison on CPU copies in the native dtype (a float64 upcast would compare
the float32-rounded element with the unrounded scalar); ``Pows`` against float64.

Trace ingest: ``aten::eq`` / ``ne`` / ``gt`` (tensor-scalar or tensor-tensor) and ``aten::pow``
with a floating tensor base and a scalar exponent.
"""

from __future__ import annotations

import random
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.elementwise import ScalarAwareReplay, scalar_aware_inputs, scalar_aware_outputs
from perf_plugin.replay.kernels.matmul import broadcast_shapes
from perf_plugin.replay.tensors import DTYPES, FLOATING, KernelRow, TensorSpec, shape_text
from perf_plugin.trace.args import broadcast, is_scalar_arg, promote, scalar_dtype, tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot, TraceMapper

if TYPE_CHECKING:
    import torch

# The exponent is not recorded: gradient clipping raises L2 norms to ``norm_type``, 2.0.
POWS_EXPONENT = 2.0


# ----------------------------------------------------------------------------- trace ingest
def _trace_comparison(kernel_type: str) -> TraceMapper:
    """``x op scalar`` keeps the scalar as an empty slot in the compute dtype (FLOAT for a FLOAT
    tensor, as the real rows write it); ``x op y`` broadcasts.  The output is BOOL."""

    def mapper(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
        x = tensor_arg(op, 0)
        if x is None or not x.dtype or len(op.types) != 2:
            return None  # ``.out`` overloads carry a third argument
        if op.types[1] == "Scalar":
            other = Slot(None, promote(x, scalar_dtype(op, 1), b_is_dimensioned=False))
            return MappedOp(kernel_type, (Slot(x.shape, x.dtype), other), (Slot(x.shape, "BOOL"),))
        y = tensor_arg(op, 1)
        shape = broadcast(x.shape, y.shape) if y is not None and y.dtype else None
        if y is None or shape is None:
            return None
        return MappedOp(kernel_type, (Slot(x.shape, x.dtype), Slot(y.shape, y.dtype)), (Slot(shape, "BOOL"),))

    return mapper


def _trace_pows(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """``pow(tensor, scalar)`` of a floating tensor (``pow(tensor, tensor)`` is another kernel)."""
    x = tensor_arg(op, 0)
    if x is None or x.dtype not in ("FLOAT", "FLOAT16", "DT_BF16", "DOUBLE") or len(op.types) != 2:
        return None
    if op.types[1] != "Scalar" or not is_scalar_arg(op, 1):
        return None
    return MappedOp("Pows", (Slot(x.shape, x.dtype), Slot(None, x.dtype)), (Slot(x.shape, x.dtype),))


# ----------------------------------------------------------------------------- replays
class _ScalarOperandReplay(ScalarAwareReplay):
    """``function(x, other)``: ``other`` a host scalar (empty second slot) or a tensor."""

    function: ClassVar[str] = ""

    def operands(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
        inputs = scalar_aware_inputs(row)
        outputs = scalar_aware_outputs(row)
        if len(inputs) != 2 or len(outputs) != 1:
            raise CaseBuildError(
                f"{row.kernel_type} needs input slots x;other and one output, got {len(inputs)} input "
                f"slot(s) and {len(outputs)} output(s)"
            )
        x, other = inputs
        for name, spec in (("x", x), ("other", other)):
            if spec.dtype == "BOOL" or spec.dtype not in DTYPES:
                raise CaseBuildError(f"{row.kernel_type} {name} has dtype {spec.dtype}, expected a numeric dtype")
        return x, other, outputs[0]

    @staticmethod
    def scalar_slot(row: KernelRow) -> bool:
        """Whether the second operand is an empty slot (a host scalar) rather than a tensor."""
        return len(row.inputs) < 2 or not row.inputs[1].present

    @staticmethod
    def draw_scalar(spec: TensorSpec, generator: "torch.Generator | None", low: float, high: float) -> float | int:
        """A scalar from the case's seed, without touching the device (floats in [low, high))."""
        rng = random.Random(generator.initial_seed() if generator is not None else None)
        if spec.dtype in FLOATING:
            return rng.uniform(low, high)
        return rng.randrange(int(low) - 1, int(high) + 2)

    def run(self, x: "torch.Tensor", other: "torch.Tensor | float | int") -> "torch.Tensor":
        import torch

        result: torch.Tensor = getattr(torch, self.function)(x, other)
        return result


class _ComparisonReplay(_ScalarOperandReplay):
    """``Equal`` / ``NotEqual`` / ``Greater``: BOOL output of the broadcast shape, exact."""

    # Whether equal elements are planted (an equality test of random values is all False).
    plant_equal: ClassVar[bool] = True

    def check(self, row: KernelRow) -> None:
        x, other, out = self.operands(row)
        assert x.shape is not None and other.shape is not None and out.shape is not None
        shape = broadcast_shapes(x.shape, other.shape)
        if shape != out.shape:
            raise CaseBuildError(
                f"{row.kernel_type} shapes are inconsistent: x {shape_text(x)} and other {shape_text(other)} "
                + ("do not broadcast" if shape is None else f"broadcast to {shape_text(shape)}")
                + f", the output is {shape_text(out)}"
            )
        if out.dtype != "BOOL":
            raise CaseBuildError(f"{row.kernel_type} output dtype is {out.dtype}, a comparison gives BOOL")

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        self.check(row)
        x_spec, other_spec, _ = self.operands(row)
        x = self.random(x_spec, device, generator, low=-50, high=50)
        if self.scalar_slot(row):
            scalar = self.draw_scalar(other_spec, generator, -1.0, 1.0)
            if self.plant_equal:
                x.view(-1)[:1].fill_(scalar)  # at least one element equals the scalar
            return x, scalar
        y = self.random(other_spec, device, generator, low=-50, high=50)
        if self.plant_equal and y.shape == x.shape and y.dtype == x.dtype:
            y.view(-1)[::2].copy_(x.view(-1)[::2])  # half the elements equal
        return x, y

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0

    def reference(self, x: "torch.Tensor", other: "torch.Tensor | float | int") -> "torch.Tensor":
        import torch

        if isinstance(other, torch.Tensor):
            other = other.detach().to("cpu", copy=True)
        return self.run(x.detach().to("cpu", copy=True), other)


class EqualReplay(_ComparisonReplay):
    kernel_types = ("Equal",)
    npu_api = "torch.eq"
    function = "eq"
    trace_ops = MappingProxyType({"aten::eq": _trace_comparison("Equal")})


class NotEqualReplay(_ComparisonReplay):
    kernel_types = ("NotEqual",)
    npu_api = "torch.ne"
    function = "ne"
    trace_ops = MappingProxyType({"aten::ne": _trace_comparison("NotEqual")})


class GreaterReplay(_ComparisonReplay):
    kernel_types = ("Greater",)
    npu_api = "torch.gt"
    function = "gt"
    plant_equal = False  # a threshold inside the values' range already splits them
    trace_ops = MappingProxyType({"aten::gt": _trace_comparison("Greater")})


class PowsReplay(_ScalarOperandReplay):
    """``Pows``: ``x ** exponent`` with a host exponent (2.0); a tensor exponent is ``Pow``."""

    kernel_types = ("Pows",)
    npu_api = "torch.pow"
    function = "pow"
    trace_ops = MappingProxyType({"aten::pow": _trace_pows})

    def check(self, row: KernelRow) -> None:
        x, _, out = self.operands(row)
        if not self.scalar_slot(row):
            raise CaseBuildError(
                f"{row.kernel_type} exponent (input slot 1) is a tensor {shape_text(row.inputs[1])}: "
                "Pows takes a scalar exponent (a tensor exponent is the Pow kernel)"
            )
        if x.dtype not in FLOATING:
            raise CaseBuildError(f"{row.kernel_type} base dtype {x.dtype} is not floating")
        if out.shape != x.shape or out.dtype != x.dtype:
            raise CaseBuildError(
                f"{row.kernel_type} output {shape_text(out)} {out.dtype} should be the base's "
                f"{shape_text(x)} {x.dtype}"
            )

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        self.check(row)
        x, _, _ = self.operands(row)
        return self.random(x, device, generator), POWS_EXPONENT
