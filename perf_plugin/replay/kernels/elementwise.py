"""Elementwise replays: ``Add`` and ``Mul`` (tensor x tensor), ``Muls`` (tensor x scalar), ``Cast``.

Ascend profilers write a 0-d tensor as an empty shape slot that still has a data type: ``Mul``
with ``"4096;"`` / ``FLOAT;FLOAT`` multiplies a ``[4096]`` tensor by a 0-d tensor, and ``Add``
with ``";"`` / ``INT64;INT64`` and output ``""`` / ``INT64`` adds two 0-d tensors into a 0-d
output.  These replays read such slots (and an output cell with a dtype but no shape) as
shape ``()``.  Formats (``ND``, ``NCHW``, ``NCL``...) name the logical layout of a contiguous
tensor and are not reproduced further.
"""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from perf_plugin.database.shapes import split_slots
from perf_plugin.database.signature import normalise_dtype, normalise_format
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.host_scalars import as_passed, host_scalar_slot, placed
from perf_plugin.replay.kernels.matmul import broadcast_shapes
from perf_plugin.replay.value_draws import recorded_zero_shares, with_zero_share
from perf_plugin.trace.args import (
    DEFAULT_FLOAT,
    SCALAR_TYPE_CODES,
    broadcast,
    category,
    concrete_arg,
    is_scalar_arg,
    promote,
    scalar_dtype,
    tensor_arg,
)
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot, TraceMapper
from perf_plugin.replay.tensors import (
    DTYPES,
    FLOATING,
    KernelRow,
    TensorSpec,
    shape_text,
)

if TYPE_CHECKING:
    import torch


def scalar_aware_dtype_slots(row: KernelRow) -> tuple[TensorSpec, ...]:
    """The input slots plus the dtype-only slots past the last shape slot (0-d tensors)."""
    return _recorded_slots(row, "Input")


def _recorded_slots(row: KernelRow, side: str) -> tuple[TensorSpec, ...]:
    """The row's slots on one side, plus dtype-only slots past the last shape slot.

    A 0-d input of a one-input op is written as an empty shape cell with one dtype, which
    parses as no slot at all; the dtype cell (kept in ``row.attrs``) still names it.
    """
    specs = row.inputs if side == "Input" else row.outputs
    dtypes = [normalise_dtype(t) for t in split_slots(row.attrs.get(f"{side} Data Types", ""))]
    formats = [normalise_format(t) for t in split_slots(row.attrs.get(f"{side} Formats", ""))]
    extra = [
        TensorSpec(None, dtypes[i], formats[i] if i < len(formats) else "")
        for i in range(len(specs), len(dtypes))
    ]
    return tuple(specs) + tuple(extra)


def scalar_aware_inputs(row: KernelRow) -> tuple[TensorSpec, ...]:
    """Input slots, with 0-d tensors (empty shape, known dtype) given the shape ``()``."""
    specs = []
    for index, spec in enumerate(_recorded_slots(row, "Input")):
        if spec.shape is None:
            if not spec.dtype:
                raise CaseBuildError(f"{row.kernel_type} input slot {index} is empty and has no data type")
            if spec.dtype not in DTYPES:
                raise CaseBuildError(f"{row.kernel_type} input slot {index} has unknown dtype {spec.dtype!r}")
            spec = TensorSpec((), spec.dtype, spec.format)
        specs.append(spec)
    return tuple(specs)


def scalar_aware_outputs(row: KernelRow) -> tuple[TensorSpec, ...]:
    """Output slots that hold a tensor: a shape, or no shape but a known dtype (0-d)."""
    specs = []
    for spec in _recorded_slots(row, "Output"):
        if spec.shape is None and spec.dtype in DTYPES:
            spec = TensorSpec((), spec.dtype, spec.format)
        if spec.shape is not None:
            specs.append(spec)
    return tuple(specs)


def one_input_one_output(row: KernelRow) -> tuple[TensorSpec, TensorSpec]:
    """(input, output) of a row with exactly one of each (0-d tensors included)."""
    inputs = scalar_aware_inputs(row)
    outputs = scalar_aware_outputs(row)
    if len(inputs) != 1 or len(outputs) != 1:
        raise CaseBuildError(
            f"{row.kernel_type} needs one input and one output, got {len(inputs)} input slot(s) and "
            f"{len(outputs)} output(s)"
        )
    return inputs[0], outputs[0]


class ScalarAwareReplay(OpReplay):
    """A replay of rows whose slots may be 0-d tensors (an empty shape with a dtype).

    Its outputs are the row's ``scalar_aware_outputs``; ``operands`` reads the slots it uses,
    raising CaseBuildError for a row it cannot replay, and is the whole ``check`` unless a
    subclass checks more.
    """

    def expected_outputs(self, row: KernelRow) -> Sequence[TensorSpec]:
        return scalar_aware_outputs(row)

    @abstractmethod
    def operands(self, row: KernelRow) -> object:
        """The row's slots as ``make_inputs`` uses them; CaseBuildError for a row it cannot replay."""

    def check(self, row: KernelRow) -> None:
        self.operands(row)


# ----------------------------------------------------------------------------- trace ingest
# A Python number passed to a tensor op arrives as a 0-d CPU tensor of these dtypes (a "wrapped
# number": ``y * 0.5`` records a 0-d ``double``); a 0-d tensor of any other dtype is a real tensor.
WRAPPED_NUMBER_DTYPES = frozenset({"DOUBLE", "INT64", "BOOL"})


def _trace_binary(kernel_type: str, scalar_kernel_type: str | None = None, true_division: bool = False) -> TraceMapper:
    """A binary operator: broadcasting and PyTorch's type promotion give the output.

    A tensor-scalar call keeps the scalar as an empty second slot carrying its dtype, as Ascend
    profiles record tensor-scalar ``Mul`` (``1000;`` / ``FLOAT;FLOAT``), unless the kernel type
    has a scalar variant of its own (``Muls``).
    """

    def mapper(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
        a = tensor_arg(op, 0)
        if a is None or a.rank == 0 or len(op.types) < 2:
            return None
        if true_division and concrete_arg(op, 2) not in (None,):
            return None  # div with rounding_mode is floor/trunc division, not RealDiv
        if is_scalar_arg(op, 1):
            operand = scalar_dtype(op, 1)
            dtype = promote(a, operand, b_is_dimensioned=False)
            if true_division and category(dtype) in (0, 1):
                dtype = DEFAULT_FLOAT
            out = (Slot(a.shape, dtype),)
            if op.types[1] != "Scalar" and operand not in WRAPPED_NUMBER_DTYPES:
                # a 0-d tensor on the device: it keeps its own dtype (the kernel reads and casts it,
                # a float32 scale divided into a bf16 tensor is not a bf16 scalar), never a host scalar;
                # its slot is 0-d rather than empty, so the reuse inference finds the kernel that wrote it
                return MappedOp(kernel_type, (Slot(a.shape, a.dtype), Slot((), operand)), out)
            if scalar_kernel_type is not None:
                return MappedOp(scalar_kernel_type, (Slot(a.shape, a.dtype),), out)
            return MappedOp(kernel_type, (Slot(a.shape, a.dtype), Slot(None, dtype)), out)
        b = tensor_arg(op, 1)
        if b is None:
            return None
        shape = broadcast(a.shape, b.shape)
        dtype = promote(a, b.dtype, b_is_dimensioned=True)
        if true_division and category(dtype) in (0, 1):
            dtype = DEFAULT_FLOAT
        if op.name.endswith("_"):
            shape = a.shape if shape == a.shape else None  # in place: the result is ``a``
            dtype = a.dtype
        outputs = (Slot(shape, dtype),) if shape is not None else ()
        return MappedOp(kernel_type, (Slot(a.shape, a.dtype), Slot(b.shape, b.dtype)), outputs)

    return mapper


def _trace_cast(op: TraceOp, descendants: list[TraceOp]) -> MappedOp | None:
    """``_to_copy`` / ``to`` that change the dtype (its ``dtype`` argument, else the copy's target)."""
    x = tensor_arg(op, 0)
    if x is None:
        return None
    to_copy = op if op.name == "aten::_to_copy" else next((d for d in descendants if d.name == "aten::_to_copy"), None)
    if to_copy is None:
        return None
    code = concrete_arg(to_copy, 1)
    target = SCALAR_TYPE_CODES.get(code, "") if isinstance(code, int) and not isinstance(code, bool) else ""
    if not target:
        copy = next((d for d in [to_copy, *descendants] if d.name == "aten::copy_"), None)
        destination = tensor_arg(copy, 0) if copy is not None else None
        target = destination.dtype if destination is not None else ""
    if not target or target == x.dtype:
        return None  # a copy without a dtype change (device or layout): not a Cast
    return MappedOp("Cast", (Slot(x.shape, x.dtype),), (Slot(x.shape, target),))


def _ops(*names: str, mapper: TraceMapper) -> MappingProxyType[str, TraceMapper]:
    return MappingProxyType({f"aten::{name}": mapper for name in names})


# ----------------------------------------------------------------------------- replays
class _ElementwiseReplay(ScalarAwareReplay):
    """Shared slot handling of the elementwise replays."""

    input_count = 1

    def operands(self, row: KernelRow) -> tuple[tuple[TensorSpec, ...], TensorSpec]:
        inputs = scalar_aware_inputs(row)
        if len(inputs) != self.input_count:
            raise CaseBuildError(
                f"{row.kernel_type} needs {self.input_count} input slot(s), got {len(inputs)}"
            )
        outputs = scalar_aware_outputs(row)
        if len(outputs) != 1:
            raise CaseBuildError(f"{row.kernel_type} needs exactly one output, got {len(outputs)}")
        return inputs, outputs[0]


class _BinaryReplay(_ElementwiseReplay):
    """Two tensors with broadcasting and dtype promotion (``Add``, ``Mul``).

    ``Add(FLOAT, BF16) -> FLOAT`` is ordinary promotion; when the row's output dtype differs
    from the promoted one (an in-place op into a narrower tensor) the result is written through
    ``out=`` into a preallocated output of the recorded dtype, which is still one kernel.
    """

    input_count = 2
    # The torch operator ``run`` calls (``torch.<function>``), with ``out=`` when the row's
    # output dtype differs from the promoted one.
    function: ClassVar[str] = ""

    def check(self, row: KernelRow) -> None:
        (x, y), out = self.operands(row)
        assert x.shape is not None and y.shape is not None and out.shape is not None
        shape = broadcast_shapes(x.shape, y.shape)
        if shape != out.shape:
            raise CaseBuildError(
                f"{row.kernel_type} shapes are inconsistent: {shape_text(x)} and {shape_text(y)} "
                + ("do not broadcast" if shape is None else f"broadcast to [{','.join(map(str, shape))}]")
                + f", the output is {shape_text(out)}"
            )
        if out.dtype not in FLOATING and (x.dtype in FLOATING or y.dtype in FLOATING):
            raise CaseBuildError(
                f"{row.kernel_type} output dtype {out.dtype} is not floating but an input is "
                f"({x.dtype};{y.dtype}); a floating result cannot be written into it"
            )

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        self.check(row)
        (x_spec, y_spec), out_spec = self.operands(row)
        host = host_scalar_slot(row, (x_spec, y_spec))  # a Python number in the model: a CPU scalar
        x = self.random(x_spec, *placed(host == 0, device, generator))
        y = self.random(y_spec, *placed(host == 1, device, generator))
        shares = recorded_zero_shares(row)  # a division's zero operands, where a capture recorded them
        if shares and host != 0:
            x = with_zero_share(x, shares[0], generator)
        if len(shares) > 1 and host != 1:
            y = with_zero_share(y, shares[1], generator, avoid=x)
        if host == 1:  # (a number cannot be the first operand of torch.add and its kin)
            y = as_passed(y, x, out_spec.torch_dtype())
        if torch.result_type(x, y) == out_spec.torch_dtype():
            return x, y
        return x, y, self.random(out_spec, device, generator)

    def run(self, x: "torch.Tensor", y: "torch.Tensor", out: "torch.Tensor | None" = None) -> "torch.Tensor":
        import torch

        function = getattr(torch, self.function)
        result: torch.Tensor = function(x, y) if out is None else function(x, y, out=out)
        return result


class AddReplay(_BinaryReplay):
    kernel_types = ("Add",)
    npu_api = "torch.add"
    function = "add"
    trace_ops = _ops("add", "add_", mapper=_trace_binary("Add"))


class MulReplay(_BinaryReplay):
    kernel_types = ("Mul",)
    npu_api = "torch.mul"
    function = "mul"
    trace_ops = _ops("mul", "mul_", mapper=_trace_binary("Mul", "Muls"))  # tensor x scalar: Muls


class SubReplay(_BinaryReplay):
    kernel_types = ("Sub",)
    npu_api = "torch.sub"
    function = "sub"
    trace_ops = _ops("sub", "sub_", mapper=_trace_binary("Sub"))


class RealDivReplay(_BinaryReplay):
    """True division (integer inputs give a floating result, written into the row's dtype)."""

    kernel_types = ("RealDiv",)
    npu_api = "torch.div"
    function = "div"
    zero_share_inputs = (0, 1)  # a zero numerator takes the slower division (``_BinaryReplay`` zeroes them)
    trace_ops = _ops("div", "div_", mapper=_trace_binary("RealDiv", true_division=True))


class MulsReplay(_ElementwiseReplay):
    """``Muls``: a tensor times a host scalar (the scalar is an attribute the row does not record).

    The scalar is drawn from the case's generator seed (uniform in +-[0.5, 1.5] for floats,
    2..9 for integers) without touching the device, so building inputs stays one pass.
    """

    kernel_types = ("Muls",)
    npu_api = "torch.mul"

    def check(self, row: KernelRow) -> None:
        (x,), out = self.operands(row)
        if x.shape != out.shape:
            raise CaseBuildError(f"{row.kernel_type} output {shape_text(out)} differs from the input {shape_text(x)}")
        if x.dtype != out.dtype:
            raise CaseBuildError(
                f"{row.kernel_type} output dtype {out.dtype} differs from the input dtype {x.dtype}"
            )

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        self.check(row)
        (x_spec,), _ = self.operands(row)
        rng = random.Random(generator.initial_seed() if generator is not None else None)
        scalar: float | int
        if x_spec.dtype in FLOATING:
            scalar = rng.uniform(0.5, 1.5) * rng.choice((-1.0, 1.0))
        else:
            scalar = rng.randrange(2, 10)
        return self.random(x_spec, device, generator), scalar

    def run(self, x: "torch.Tensor", scalar: float) -> "torch.Tensor":
        return x.mul(scalar)


class CastReplay(_ElementwiseReplay):
    """``Cast``: ``x.to(dtype)``; the reference is the float64 value rounded to the target dtype."""

    kernel_types = ("Cast",)
    npu_api = "torch.Tensor.to"
    trace_ops = _ops("_to_copy", "to", mapper=_trace_cast)

    def check(self, row: KernelRow) -> None:
        (x,), out = self.operands(row)
        if x.shape != out.shape:
            raise CaseBuildError(f"{row.kernel_type} output {shape_text(out)} differs from the input {shape_text(x)}")
        if x.dtype == out.dtype:
            # x.to(same dtype) returns x itself and launches nothing; a same-dtype copy is TensorMove.
            raise CaseBuildError(
                f"{row.kernel_type} input and output dtype are both {x.dtype}: nothing to convert "
                "(a same-dtype copy is TensorMove)"
            )

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        self.check(row)
        (x_spec,), out_spec = self.operands(row)
        return self.random(x_spec, device, generator), out_spec.torch_dtype()

    def run(self, x: "torch.Tensor", dtype: "torch.dtype") -> "torch.Tensor":
        return x.to(dtype)

    def reference(self, x: "torch.Tensor", dtype: "torch.dtype") -> "torch.Tensor":
        source = x.detach().to("cpu")
        if source.is_floating_point():
            source = source.double()
        return source.to(dtype)
