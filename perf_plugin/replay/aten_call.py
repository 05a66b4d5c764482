"""A traced ``aten`` call as data: which argument is which tensor slot, and the others' values.

A PyTorch trace recorded with ``record_shapes=True`` gives, per argument of an operator, its
dims and element type (tensors), its value (``Concrete Inputs``: scalars, int lists, dtype codes)
or nothing (``None``).  That is enough to call the operator again: the row's tensor slots hold
the tensors, and the ``Op Arguments`` cell holds the rest as compact JSON::

    {"overload": "dim", "args": [{"tensor": 0}, [-1], true, null]}

``{"tensor": k}`` is input slot ``k``, ``{"tensors": [k, ...]}`` a tensor list (``null`` entries
are ``None`` in a list of optional tensors: ``aten::index``'s indices, which the profiler does
not record and ``perf_plugin.trace.index_lists`` recovers from the operator's callees), anything
else the argument's value.  ``overload`` names the ``torch.ops.aten`` overload the arguments
select; it is found at ingest by calling the candidates on ``meta`` tensors (no memory, no
arithmetic), which also gives the output shapes and dtypes the trace does not record.  A call
made in place also names its ``operator`` (``index_put_``): the row's kernel type drops the
trailing underscore.  Integer values of ``dtype`` arguments are ``at::ScalarType`` codes; they
become ``torch.dtype`` objects where the overload's schema takes a ScalarType.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perf_plugin.trace.args import (
    NON_TENSOR_TYPES,
    SCALAR_TYPE_CODES,
    TORCH_DTYPE_NAMES,
    Shape,
    concrete_value,
    tensor_arg,
    tensor_list_arg,
)
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.index_lists import INDICES_ARGUMENT, recover_indices

if TYPE_CHECKING:
    import torch

TENSOR = "tensor"
TENSORS = "tensors"


class AtenCallError(Exception):
    """The recorded arguments cannot be turned into a call (the message says why)."""


@dataclass(frozen=True)
class TensorSlot:
    shape: Shape
    dtype: str
    strides: Shape | None


@dataclass(frozen=True)
class RecordedCall:
    """An aten operator's arguments: the tensor slots and the template that places them."""

    name: str  # "mean" for aten::mean
    slots: tuple[TensorSlot, ...]
    template: tuple[Any, ...]
    overload: str = ""

    def arguments_cell(self) -> str:
        document: dict[str, Any] = {"overload": self.overload, "args": list(self.template)}
        if self.name.endswith("_"):
            # the row's kernel type drops the trailing underscore (``aten.index_put``); the cell
            # records that the model wrote in place
            document["operator"] = self.name
        return json.dumps(document, separators=(",", ":"))


def record_call(op: TraceOp) -> RecordedCall:
    """The arguments of a traced ``aten::`` operator (tensor slots in argument order)."""
    slots: list[TensorSlot] = []
    template: list[Any] = []
    for index, kind in enumerate(op.types):
        tensor = tensor_arg(op, index)
        if tensor is not None:
            template.append({TENSOR: len(slots)})
            slots.append(TensorSlot(tensor.shape, tensor.dtype, tensor.strides))
            continue
        items = tensor_list_arg(op, index)
        if items is not None:
            template.append({TENSORS: list(range(len(slots), len(slots) + len(items)))})
            slots.extend(TensorSlot(t.shape, t.dtype, t.strides) for t in items)
            continue
        indices = recover_indices(op) if index == INDICES_ARGUMENT else None
        if indices is not None:
            entries: list[int | None] = []
            for item in indices:
                entries.append(None if item is None else len(slots))
                if item is not None:
                    slots.append(TensorSlot(item.shape, item.dtype, item.strides))
            template.append({TENSORS: entries})
            continue
        if kind not in NON_TENSOR_TYPES:
            raise AtenCallError(f"argument {index} of type {kind!r} is neither a tensor nor a value")
        raw = op.concrete[index] if index < len(op.concrete) else ""
        template.append(concrete_value(raw) if raw != "" else None)
    return RecordedCall(op.name.split("::", 1)[1], tuple(slots), tuple(template))


def parse_arguments(cell: str) -> tuple[str, tuple[Any, ...]]:
    """(overload, template) of an ``Op Arguments`` cell."""
    try:
        document = json.loads(cell)
        overload = str(document.get("overload", ""))
        template = tuple(document["args"])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise AtenCallError(f"not an argument record ({exc})") from None
    return overload, template


def recorded_operator(cell: str) -> str:
    """The operator an ``Op Arguments`` cell names (in-place calls only), else ""."""
    try:
        document = json.loads(cell)
    except ValueError:
        return ""
    operator = document.get("operator", "") if isinstance(document, dict) else ""
    return operator if isinstance(operator, str) else ""


def slots_used(template: Sequence[Any]) -> list[int]:
    used: list[int] = []
    for value in template:
        if isinstance(value, dict) and TENSOR in value:
            used.append(int(value[TENSOR]))
        elif isinstance(value, dict) and TENSORS in value:
            used.extend(int(k) for k in value[TENSORS] if k is not None)
    return used


def packet(name: str) -> Any:
    import torch

    try:
        return getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        raise AtenCallError(f"torch has no operator aten::{name}") from None


def _is_scalar_type(argument: Any) -> bool:
    return "ScalarType" in str(argument.type)


def build_arguments(
    template: Sequence[Any], tensors: Sequence[Any], schema: Any = None, device: Any = None
) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments: slots replaced by tensors, dtype codes by dtypes.

    The profiler records keyword-only arguments among the positional ones, in schema order
    (``mean.dim(self, dim, keepdim, *, dtype)``); with a schema they are passed by name.  A
    ``device`` argument the trace left unset (a factory such as ``randint`` called on the default
    device) becomes ``device``, so that the call runs where the replay does.
    """
    import torch

    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    for position, value in enumerate(template):
        argument = schema.arguments[position] if schema is not None and position < len(schema.arguments) else None
        if isinstance(value, dict) and TENSOR in value:
            value = tensors[int(value[TENSOR])]
        elif isinstance(value, dict) and TENSORS in value:
            value = [None if k is None else tensors[int(k)] for k in value[TENSORS]]
        elif isinstance(value, int) and not isinstance(value, bool) and argument is not None and _is_scalar_type(argument):
            value = getattr(torch, _TORCH_DTYPES[SCALAR_TYPE_CODES[value]])
        if argument is not None and argument.name == "device" and value is None:
            value = device
        if argument is not None and argument.kwarg_only:
            # an unset optional keyword is left out, unless the schema gives it no default
            # (``randint.low_generator``'s ``Generator? generator``): then it is passed as None
            if value is not None or not argument.has_default_value():
                keywords[argument.name] = value
        else:
            positional.append(value)
    return positional, keywords


_TORCH_DTYPES = {ascend: name for name, ascend in TORCH_DTYPE_NAMES.items()}


def torch_dtype(name: str) -> "torch.dtype":
    import torch

    try:
        return getattr(torch, _TORCH_DTYPES[name])  # type: ignore[no-any-return]
    except KeyError:
        raise AtenCallError(f"no torch dtype for {name!r}") from None


def overload_of(name: str, overload: str) -> Any:
    target = packet(name)
    try:
        return getattr(target, overload or "default")
    except AttributeError:
        raise AtenCallError(f"aten::{name} has no overload {overload!r}") from None


def call(name: str, overload: str, template: Sequence[Any], tensors: Sequence[Any], device: Any = None) -> Any:
    """Call the recorded overload on ``tensors`` (factories on ``device``)."""
    function = overload_of(name, overload)
    positional, keywords = build_arguments(template, tensors, function._schema, device)
    return function(*positional, **keywords)


def meta_tensors(slots: Sequence[TensorSlot]) -> list[Any]:
    """The slots as ``meta`` tensors, but a 0-d float64 slot after the first as a Python float.

    The profiler records a Python number passed to a tensor argument (``scale / 448.0``) as the
    0-d float64 tensor it is wrapped in, and a wrapped number stays out of type promotion where a
    0-d tensor would not: with a 0-d float32 ``scale`` the quotient is float32, not float64.  A
    0-d float64 tensor of a model's own is rare, so the output is resolved as the number gave it.
    """
    import torch

    tensors: list[Any] = []
    for index, slot in enumerate(slots):
        dtype = torch_dtype(slot.dtype)
        if index > 0 and not slot.shape and dtype == torch.float64:
            tensors.append(1.0)
        elif slot.strides is not None:
            tensors.append(torch.empty_strided(slot.shape, slot.strides, dtype=dtype, device="meta"))
        else:
            tensors.append(torch.empty(slot.shape, dtype=dtype, device="meta"))
    return tensors


def resolve_on_meta(recorded: RecordedCall) -> tuple[RecordedCall, list["torch.Tensor"]]:
    """The first overload the arguments call successfully on ``meta`` tensors, and its outputs."""
    tensors = meta_tensors(recorded.slots)
    target = packet(recorded.name)
    errors = []
    for overload in target.overloads():
        function = getattr(target, overload)
        try:
            positional, keywords = build_arguments(recorded.template, tensors, function._schema, "meta")
            result = function(*positional, **keywords)
        except Exception as exc:  # noqa: BLE001 - overloads reject arguments in many ways
            errors.append(f"{overload}: {type(exc).__name__}")
            continue
        return RecordedCall(recorded.name, recorded.slots, recorded.template, overload), tensor_outputs(result)
    raise AtenCallError(f"no overload of aten::{recorded.name} takes these arguments ({'; '.join(errors[:4])})")


def tensor_outputs(result: Any) -> list[Any]:
    """The tensors an operator returned, in order (non-tensor results dropped)."""
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [item for item in result if isinstance(item, torch.Tensor)]
    return []
