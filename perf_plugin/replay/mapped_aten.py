"""Kernel types that ``op_mapping.yaml`` maps from an aten operator, replayed through that operator.

A database's ``op_mapping.yaml`` names, for a framework operator such as ``aten.sigmoid.default``,
the kernel type it launches (``Sigmoid``).  A kernel type with no replay of its own and no primary
whose replay stands for it (``perf_plugin.replay.op_mapping``) is replayed through that operator:
its row's tensor slots, in order, are the operator's tensor arguments, and every other argument
takes the schema's default.  The call is then the generic ``aten.<op>`` replay's
(``perf_plugin.replay.kernels.aten_ops``: fresh tensors of the row's shapes and dtypes, the same
overload on float64 CPU copies as the reference).

A row it cannot build says why: the operator takes an argument the row does not record (a
``dim``, a ``normalized_shape``, a scalar with no default), a tensor list, or another number of
tensors than the row has.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perf_plugin.database.schema import OP_ARGUMENTS
from perf_plugin.replay.aten_call import AtenCallError, overload_of
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels.aten_ops import AtenOpReplay
from perf_plugin.replay.kernels.elementwise import scalar_aware_dtype_slots
from perf_plugin.replay.tensors import KernelRow, TensorSpec

if TYPE_CHECKING:
    import torch

ATEN_PREFIX = "aten."


def split_operator(name: str) -> tuple[str, str] | None:
    """``aten.sigmoid.default`` -> (``sigmoid``, ``default``); None for any other namespace."""
    if not name.startswith(ATEN_PREFIX):
        return None
    operator, _, overload = name[len(ATEN_PREFIX):].partition(".")
    return (operator, overload or "default") if operator else None


def argument_template(operator: str, overload: str, slots: int) -> list[Any]:
    """The ``Op Arguments`` template of a call whose tensor arguments are the row's ``slots``
    slots in order, every other argument at its default; CaseBuildError where there is none."""
    try:
        schema = overload_of(operator, overload)._schema
    except AtenCallError as exc:
        raise CaseBuildError(str(exc)) from None
    template: list[Any] = []
    tensors = 0
    for argument in schema.arguments:
        kind = str(argument.type)
        if kind.startswith("Tensor") and not kind.startswith("Tensor[]") and not argument.kwarg_only:
            if tensors < slots:
                template.append({"tensor": tensors})
                tensors += 1
                continue
            if argument.has_default_value():
                break
            raise CaseBuildError(f"aten.{operator}.{overload} takes more tensors than the row's {slots} slot(s)")
        if not argument.has_default_value():
            raise CaseBuildError(f"aten.{operator}.{overload} takes {argument.name} ({kind}), which the row does not record")
        if argument.kwarg_only:
            break
        template.append(argument.default_value)
    if tensors != slots:
        raise CaseBuildError(f"aten.{operator}.{overload} takes {tensors} tensor(s); the row has {slots} slot(s)")
    while template and not isinstance(template[-1], dict):
        template.pop()  # trailing defaults: left to the schema
    return template


class MappedAtenReplay(OpReplay):
    """One kernel type's rows as calls of the aten operator ``op_mapping.yaml`` maps to it."""

    npu_api = "torch.ops.aten"

    def __init__(self, operator: str, overload: str) -> None:
        self.operator, self.overload = operator, overload
        self.inner = AtenOpReplay()

    def aten_row(self, row: KernelRow) -> KernelRow:
        slots = len(scalar_aware_dtype_slots(row))
        template = argument_template(self.operator, self.overload, slots)
        cell = json.dumps({"overload": self.overload, "args": template}, separators=(",", ":"))
        return dataclasses.replace(row, kernel_type=f"{ATEN_PREFIX}{self.operator}", attrs={**row.attrs, OP_ARGUMENTS: cell})

    def check(self, row: KernelRow) -> None:
        self.inner.check(self.aten_row(row))

    def expected_outputs(self, row: KernelRow) -> Sequence[TensorSpec]:
        return self.inner.expected_outputs(self.aten_row(row))

    def values_verifiable(self, row: KernelRow) -> bool:
        return self.inner.values_verifiable(self.aten_row(row))

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        return self.inner.make_inputs(self.aten_row(row), device, generator)

    def run(self, *args: Any) -> Any:
        return self.inner.run(*args)

    def reference(self, *args: Any) -> Any:
        return self.inner.reference(*args)

    def parameters(self, row: KernelRow, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return self.inner.parameters(self.aten_row(row), args)
