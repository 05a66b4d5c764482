"""Which tensor each input of a traced operator is: a PyTorch execution trace beside the profile.

A Kineto trace records each operator's input shapes, not which tensors they were, so ingest infers
an input's producer from shapes (``perf_plugin.ingest.input_reuse``) and can pair it with the
wrong one: Qwen2-MoE's shared expert output ``[1,2048]`` is written before the routed experts
stream their weights, and its gate's ``mul`` reads it after them, but the routed sum of the same
shape was written just before, so the row said the operand was cached.  In the model the ``mul``
took 2.9 us; replayed with the operand cached, 1.88; with it read from memory, 3.0 (H200).

PyTorch's execution trace observer records, per operator, the storage of each input and output
tensor.  Profile with it, writing it beside the trace as ``<trace>.et.json``
(``perf_plugin.capture.execution_trace_observer`` makes one)::

    with torch.profiler.profile(..., record_shapes=True,
                                execution_trace_observer=execution_trace_observer("run.json")) as prof:
        step()
    prof.export_chrome_trace("run.json")

Each node carries the ``rf_id`` the Kineto trace's operator carries as ``Record function id``, and
each tensor is ``[tensor id, storage id, offset, elements, element size, device]``.  The storage id
follows the storage's address, which the caching allocator hands out again once a tensor is freed,
so it names the tensor live at that address: an input's producer is the latest operator before it
that wrote that storage.  ``storages_of`` aligns a mapped operator's slots with the tensors of its
node (or of the callee the mapping came from), by shape, in order.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.ingest.json_file import load_json_file
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot
from perf_plugin.trace.values_file import EXECUTION_TRACE_SUFFIX, sidecar_path


@dataclass(frozen=True)
class TracedTensor:
    """A tensor an execution trace recorded: its storage, shape, and offset in that storage (elements)."""

    storage: int
    shape: tuple[int, ...]
    offset: int = 0


@dataclass(frozen=True)
class TracedList:
    """A tensor list argument as the execution trace recorded it, whole: each tensor's shape,
    strides and element type name (``c10::BFloat16``, as the Kineto trace spells dtypes)."""

    shapes: tuple[tuple[int, ...], ...]
    strides: tuple[tuple[int, ...], ...] | None
    dtypes: tuple[str, ...]


@dataclass(frozen=True)
class TracedCall:
    """An operator's tensors, flattened in argument order (a list's tensors in its place), and its
    tensor list arguments by argument index."""

    inputs: tuple[TracedTensor, ...]
    outputs: tuple[TracedTensor, ...]
    lists: dict[int, TracedList] = field(default_factory=dict)


@dataclass(frozen=True)
class SlotStorages:
    """A mapped operator's tensors: per input slot its storage (None where not known), the
    tensors the operator wrote (its outputs, an in-place operator's ``self`` among them), and per
    input slot the offset of its view in the storage (elements; () where not known)."""

    inputs: tuple[int | None, ...]
    written: tuple[TracedTensor, ...]
    offsets: tuple[int | None, ...] = ()


ExecutionTrace = dict[int, TracedCall]  # rf_id -> the call's tensors


def execution_trace_for(trace_path: Path, explicit: Path | None = None) -> ExecutionTrace | None:
    """The execution trace given, else the one beside the trace (``run.et.json``), else None."""
    path = explicit if explicit is not None else sidecar_path(trace_path, EXECUTION_TRACE_SUFFIX)
    return read_execution_trace(path) if explicit is not None or path.is_file() else None


def read_execution_trace(path: Path) -> ExecutionTrace:
    """The calls of an execution trace file by ``rf_id``.

    Raises DatabaseError naming the file (and the node) for a document that is not one."""
    document = load_json_file(path, "an execution trace")
    nodes = document.get("nodes") if isinstance(document, dict) else None
    if not isinstance(nodes, list):
        raise DatabaseError("not an execution trace: no list of nodes", path=path)
    calls: ExecutionTrace = {}
    for node in nodes:
        try:
            record_id = next(a["value"] for a in node.get("attrs", ()) if a.get("name") == "rf_id")
            inputs = node["inputs"]
            calls[int(record_id)] = TracedCall(_tensors(inputs), _tensors(node["outputs"]), _lists(inputs))
        except StopIteration:
            continue  # the observer's own nodes carry no operator
        except (KeyError, TypeError, ValueError, AttributeError):
            raise DatabaseError(f"node {node.get('id') if isinstance(node, dict) else node!r} is not an "
                                "execution trace node (inputs and outputs of values and shapes, as schema "
                                f"1.1 writes them; this file's schema: {document.get('schema')!r})", path=path) from None
    return calls


def _tensors(side: dict[str, Any]) -> tuple[TracedTensor, ...]:
    return tuple(_flat(side["values"], side["shapes"]))


GENERIC_LIST = re.compile(r"GenericList\[(.*)\]")
ELEMENT_TYPE = re.compile(r"Tensor\(([^()]*)\)")


def _lists(side: dict[str, Any]) -> dict[int, TracedList]:
    """The arguments that are lists of tensors (``GenericList[Tensor(float),Tensor(float)]``), by index."""
    strides = side.get("strides") or []
    lists: dict[int, TracedList] = {}
    for index, (type_name, values, shapes) in enumerate(zip(side.get("types") or [], side["values"], side["shapes"])):
        match = GENERIC_LIST.fullmatch(type_name) if isinstance(type_name, str) else None
        if match is None or not isinstance(values, list) or not values:
            continue
        elements = [ELEMENT_TYPE.fullmatch(element) for element in match.group(1).split(",")]
        if len(elements) != len(values) or not all(_is_tensor(value) for value in values):
            continue
        if not all(elements) or not isinstance(shapes, list) or len(shapes) != len(values):
            continue
        listed = strides[index] if index < len(strides) else None
        lists[index] = TracedList(
            tuple(tuple(int(size) for size in shape) for shape in shapes),
            tuple(tuple(int(step) for step in steps) for steps in listed)
            if isinstance(listed, list) and len(listed) == len(values) else None,
            tuple(element.group(1) for element in elements if element is not None),
        )
    return lists


def _flat(values: Any, shapes: Any) -> Iterator[TracedTensor]:
    """The tensors among ``values`` (lists flattened), each with its shape."""
    if _is_tensor(values):
        yield TracedTensor(int(values[1]), tuple(int(size) for size in shapes), int(values[2]))
    elif isinstance(values, list) and isinstance(shapes, list) and len(values) == len(shapes):
        for value, shape in zip(values, shapes):
            yield from _flat(value, shape)


def _is_tensor(value: Any) -> bool:
    """``[tensor id, storage id, offset, elements, element size, device]``."""
    return (isinstance(value, list) and len(value) == 6 and isinstance(value[5], str)
            and all(isinstance(part, int) and not isinstance(part, bool) for part in value[:5]))


def storages_of(mapped: MappedOp, op: TraceOp, trace: ExecutionTrace) -> SlotStorages | None:
    """The storages of ``mapped``'s input slots, from the first of ``op`` and its callees whose
    recorded inputs have the slots' shapes in order (None for each where none has: the inference
    stays), and the tensors ``op`` wrote; None where the execution trace lacks ``op``."""
    own = trace.get(op.record_id) if op.record_id is not None else None
    if own is None:
        return None
    for candidate in (op, *op.descendants()):
        call = trace.get(candidate.record_id) if candidate.record_id is not None else None
        aligned = _aligned(mapped.inputs, call.inputs) if call is not None else None
        if aligned is not None:
            return SlotStorages(tuple(t.storage if t else None for t in aligned), own.outputs,
                                tuple(t.offset if t else None for t in aligned))
    return SlotStorages((None,) * len(mapped.inputs), own.outputs)


def _aligned(slots: Sequence[Slot], tensors: Sequence[TracedTensor]) -> tuple[TracedTensor | None, ...] | None:
    """Each slot's tensor, the tensors taken in order by the slots with a shape; None where a
    tensor's shape differs from its slot's or the tensors run out."""
    remaining = iter(tensors)
    aligned: list[TracedTensor | None] = []
    for slot in slots:
        if slot.shape is None:
            aligned.append(None)
            continue
        tensor = next(remaining, None)
        if tensor is None or tensor.shape != tuple(slot.shape):
            return None
        aligned.append(tensor)
    return tuple(aligned)
