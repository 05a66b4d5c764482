"""A traced operator as a database row: its kernel type and the identity cells of its slots.

A kernel type declares the operators it stands for (``OpReplay.trace_ops``): each maps a traced
operator (and the operators it called) to a ``MappedOp``, or to None when the call is not one of
its kernels (a ``div`` with a rounding mode is not a ``RealDiv``).  Slots follow the database's
layout for that kernel type; dtypes are written in the Ascend spelling and every format is ``ND``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perf_plugin.database.schema import INPUT_STRIDES, INPUT_VALUES, OP_ARGUMENTS
from perf_plugin.database.shapes import QuoteStyle, format_shape_cell
from perf_plugin.trace.args import Shape, is_contiguous
from perf_plugin.trace.events import TraceOp


@dataclass(frozen=True)
class Slot:
    # None: an empty slot (a host scalar, or an absent optional input); (): a 0-d tensor on the
    # device.  Both write an empty shape cell.
    shape: Shape | None
    dtype: str


@dataclass(frozen=True)
class MappedOp:
    kernel_type: str
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    # Per input slot, the strides the trace recorded (None where unknown); written only when an
    # input is not contiguous, since a contiguous row needs no more than its shapes.
    strides: tuple[Shape | None, ...] = ()
    arguments: str = ""  # the call's arguments, for rows replayed through torch.ops.aten
    # Per input slot, the values an input-value capture recorded (None where it did not): the
    # rows per group of a grouped GEMM, which its time depends on (``Input Values``).
    values: tuple[tuple[int, ...] | None, ...] = ()

    def cells(self, accelerator_core: str) -> dict[str, str]:
        cells = {
            "OP State": "dynamic",
            "Accelerator Core": accelerator_core,
            "Input Shapes": _shapes(self.inputs),
            "Input Data Types": ";".join(s.dtype for s in self.inputs),
            "Input Formats": ";".join("ND" for _ in self.inputs),
            "Output Shapes": _shapes(self.outputs),
            "Output Data Types": ";".join(s.dtype for s in self.outputs),
            "Output Formats": ";".join("ND" for _ in self.outputs),
            INPUT_STRIDES: self.strides_cell(),
            OP_ARGUMENTS: self.arguments,
            INPUT_VALUES: self.values_cell(),
        }
        return cells

    def values_cell(self) -> str:
        if not any(values is not None for values in self.values):
            return ""
        return format_shape_cell(list(self.values), QuoteStyle.EMBEDDED)

    def strides_cell(self) -> str:
        pairs = list(zip(self.inputs, self.strides))
        strided = any(
            slot.shape is not None and strides is not None and not is_contiguous(slot.shape, strides)
            for slot, strides in pairs
        )
        if not strided:
            return ""
        return format_shape_cell([strides for _, strides in pairs], QuoteStyle.EMBEDDED)


def _shapes(slots: Sequence[Slot]) -> str:
    return format_shape_cell([s.shape for s in slots], QuoteStyle.EMBEDDED) if slots else ""


# (the operator, the operators it called in call order) -> the row, or None when not this kernel
TraceMapper = Callable[[TraceOp, list[TraceOp]], "MappedOp | None"]
