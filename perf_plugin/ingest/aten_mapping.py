"""A top-level PyTorch operator -> a database row's kernel type and identity cells.

Kernel types
------------
A row is named after its top-level operator.  Where a kernel type declares the operator
(``OpReplay.trace_ops``, beside its replay in ``perf_plugin.replay.kernels``), its mapper gives
the row, so a GPU or CPU profile becomes a database the same replays run on (``aten::mm`` ->
``MatMulV2``, ``aten::softmax`` -> ``SoftmaxV2``, ...; ``perfdb kernels`` lists them).  A
top-level operator that is only a wrapper (``matmul`` of 4-D tensors, ``einsum``, ``reshape``,
``flatten``, ``type_as``, ``concat``, ``stack``) is named after the mapped operator it called,
which is the kernel that did the work (a 4-D ``matmul`` runs a ``bmm``, a ``stack`` a ``cat``
of its inputs unsqueezed), a GEMM first where it called several.  Every
other operator keeps its own name with ``::`` turned into ``.`` and other characters outside
``[A-Za-z0-9_.-]`` into ``_`` (``aten::gelu`` -> ``aten.gelu``, ``vllm::rms_norm`` ->
``vllm.rms_norm``).

Dtypes and formats
------------------
Dtypes are written in the Ascend spelling (``DT_BF16, FLOAT, FLOAT16, DOUBLE, INT64, INT32,
INT16, INT8, UINT8, BOOL``) and every slot's format is ``ND``; ``OP State`` is ``dynamic``.

Output cells
------------
The trace records inputs only.  Outputs are derived where the inputs determine them: by the
kernel type's own mapper, and for the other operators here: unary elementwise ops that keep
the input's shape (``gelu``, ``silu``, ``relu`` ...); comparisons (BOOL, broadcast shape); and
factories (``randn``, ``zeros`` ...: the ``size`` argument, and the ``dtype`` argument or FLOAT).
An ``aten`` call whose arguments were recorded gets its outputs from the same call on ``meta``
tensors (``perf_plugin.replay.aten_call``); a boolean-mask gather (``x[mask]``), whose result
depends on the mask's values, from the restride its callees recorded.  Where outputs cannot be derived (an operator outside these rules, or dims the profiler did not
record) the three output cells are left empty: the row keeps its measurement and inputs and has
no replay until a rule derives them.  The profiler records no dtypes for tensors passed in a
list (``cat``'s inputs); those dtype slots are left empty rather than guessed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from collections.abc import Sequence
from typing import Any

from perf_plugin.replay.aten_call import AtenCallError, RecordedCall, record_call, resolve_on_meta, torch_dtype
from perf_plugin.replay.registry import KernelCatalog
from perf_plugin.replay.registry import catalog as current_catalog
from perf_plugin.trace.args import (
    DEFAULT_FLOAT,
    SCALAR_TYPE_CODES,
    broadcast,
    category,
    concrete_arg,
    TORCH_DTYPE_NAMES,
    Shape,
    is_int_list,
    tensor_arg,
    tensor_list_arg,
    tensor_args,
)
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.index_lists import indexed_result_shape
from perf_plugin.trace.mapped import MappedOp, Slot

# Operators that do no work of their own (views, allocation, metadata).  A top-level operator
# from this set whose callees are all in it too launched nothing and is not a database row.
NO_WORK: frozenset[str] = frozenset(
    {
        "alias", "as_strided", "_reshape_alias", "view", "_unsafe_view", "view_as", "reshape", "flatten",
        "unflatten", "t", "transpose", "permute", "expand", "expand_as", "slice", "select", "squeeze",
        "unsqueeze", "unbind", "split", "split_with_sizes", "chunk", "narrow", "movedim", "diagonal",
        "detach", "detach_", "lift_fresh", "resolve_conj", "resolve_neg", "conj", "_conj", "real", "imag",
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "size", "stride", "numel", "dim", "is_nonzero",
        "result_type", "to", "type_as", "contiguous", "set_", "record_stream", "_local_scalar_dense", "item",
        "numpy_T", "mT", "mH", "adjoint", "swapaxes", "swapdims", "moveaxis", "unfold", "view_as_real",
        "view_as_complex",
    }
)
# Wrappers named after the mapped operator they called (see the module docstring).
COMPOSITES: frozenset[str] = frozenset(
    {"matmul", "einsum", "reshape", "flatten", "type_as", "linear", "tensordot", "concat", "concatenate", "stack"}
)
# Unmapped operators whose single output has the first input's shape and dtype.
SAME_AS_FIRST_INPUT: frozenset[str] = frozenset(
    {
        "gelu", "silu", "relu", "relu_", "sigmoid", "tanh", "exp", "log", "neg", "abs", "sqrt", "rsqrt",
        "sin", "cos", "erf", "reciprocal", "hardswish", "leaky_relu", "elu", "softplus", "log_softmax",
        "_log_softmax", "clamp", "clamp_", "fill_", "zero_", "copy_", "masked_fill", "masked_fill_",
        "dropout", "layer_norm", "group_norm", "pow", "cumsum", "tril", "triu", "flip", "roll",
    }
)
# Unmapped comparisons: a BOOL output of the broadcast shape.
COMPARISONS: frozenset[str] = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"})
# Factory operators: ``size`` is argument 0, the ``dtype`` code is at the given position.
FACTORY_DTYPE_ARGUMENT: dict[str, int] = {"randn": 1, "rand": 1, "zeros": 1, "ones": 1, "empty": 1, "full": 2}
_FLOAT_RESULT = frozenset(
    {"sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "erf", "reciprocal", "gelu", "silu"}
)


def short_name(name: str) -> str:
    return name[len("aten::") :] if name.startswith("aten::") else ""


def sanitise_operator_name(name: str) -> str:
    """``aten::gelu`` -> ``aten.gelu``; an in-place operator's trailing ``_`` goes (its row
    records the operator), but a Python operator's name keeps its underscores (``aten::__and__``
    -> ``aten.__and__``: ``aten::__and`` is no operator to replay)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.\-]", "_", name.replace("::", "."))
    dunder = re.search(r"\.__[A-Za-z0-9]+__$", cleaned) is not None
    return cleaned.lstrip("._").rstrip("." if dunder else "._") or "unnamed"


def does_work(op: TraceOp, descendants: Sequence[TraceOp]) -> bool:
    """False for views, allocations and no-op conversions (no operator in them computes).

    Only operators (``namespace::name``) count: the profiler also records bare bookkeeping
    events such as ``detach_`` inside ``aten::detach_``.
    """
    for node in (op, *descendants):
        if "::" not in node.name:
            continue
        if not node.name.startswith("aten::") or short_name(node.name) not in NO_WORK:
            return True
    return False


def _mapped(op: TraceOp, descendants: list[TraceOp], catalog: KernelCatalog) -> MappedOp | None:
    for mapper in catalog.trace_mappers.get(op.name, ()):
        mapped = mapper(op, descendants)
        if mapped is not None:
            return mapped
    return None


def _fallback(op: TraceOp) -> MappedOp:
    """A row named after the operator itself; an ``aten`` call also records its arguments and,
    from a call on ``meta`` tensors, its outputs, so that ``torch.ops.aten`` can replay it."""
    inputs: list[Slot] = []
    strides: list[Shape | None] = []
    for i in range(len(op.types)):
        tensor = tensor_arg(op, i)
        if tensor is not None:
            inputs.append(Slot(tensor.shape, tensor.dtype))
            strides.append(tensor.strides)
            continue
        for item in tensor_list_arg(op, i) or []:
            inputs.append(Slot(item.shape, item.dtype))
            strides.append(item.strides)
    kernel_type = sanitise_operator_name(op.name)
    recorded = _recorded_aten_call(op)
    if recorded is not None:
        # the call's slots, which can hold tensors the profiler did not record as arguments
        # (indexing's indices, recovered from its callees)
        call, outputs = recorded
        produced = tuple(Slot(tuple(t.shape), _dtype_name(t.dtype)) for t in outputs)
        slots = tuple(Slot(slot.shape, slot.dtype) for slot in call.slots)
        return MappedOp(kernel_type, slots, produced, tuple(slot.strides for slot in call.slots), call.arguments_cell())
    return MappedOp(kernel_type, tuple(inputs), _rule_outputs(op), tuple(strides))


def _recorded_aten_call(op: TraceOp) -> tuple[RecordedCall, list[Any]] | None:
    """The call's arguments and meta outputs, where torch is installed and an overload takes them."""
    if not op.name.startswith("aten::") or importlib.util.find_spec("torch") is None:
        return None
    try:
        recorded = record_call(op)
    except AtenCallError:
        return None
    try:
        return resolve_on_meta(recorded)
    except AtenCallError:
        return _masked_gather(op, recorded)


def _masked_gather(op: TraceOp, recorded: RecordedCall) -> tuple[RecordedCall, list[Any]] | None:
    """``x[mask]``: how many elements a boolean mask selects depends on its values, so no call on
    ``meta`` tensors gives the result's shape; the operator's restride callee recorded it."""
    shape = indexed_result_shape(op)
    if shape is None or not any(slot.dtype == "BOOL" for slot in recorded.slots[1:]):
        return None
    import torch

    dtype = torch_dtype(recorded.slots[0].dtype)
    return dataclasses.replace(recorded, overload="Tensor"), [torch.empty(shape, dtype=dtype, device="meta")]


def _dtype_name(dtype: Any) -> str:
    return TORCH_DTYPE_NAMES.get(str(dtype).replace("torch.", ""), "")


def _rule_outputs(op: TraceOp) -> tuple[Slot, ...]:
    """Outputs of operators the rules of this module derive (see the module docstring)."""
    first = tensor_arg(op, 0)
    name = short_name(op.name)
    if first is not None and name in SAME_AS_FIRST_INPUT:
        dtype = first.dtype
        if name in _FLOAT_RESULT and category(dtype) in (0, 1):
            dtype = DEFAULT_FLOAT
        return (Slot(first.shape, dtype),)
    if first is not None and name in COMPARISONS:
        other = tensor_arg(op, 1)
        shape = broadcast(first.shape, other.shape) if other is not None else first.shape
        return (Slot(shape, "BOOL"),) if shape is not None else ()
    if name in FACTORY_DTYPE_ARGUMENT and is_int_list(size := concrete_arg(op, 0)):
        code = concrete_arg(op, FACTORY_DTYPE_ARGUMENT[name])
        dtype = SCALAR_TYPE_CODES.get(code, DEFAULT_FLOAT) if isinstance(code, int) else DEFAULT_FLOAT
        return (Slot(tuple(size), dtype),)
    return ()


def map_operator(
    op: TraceOp, descendants: list[TraceOp] | None = None, catalog: KernelCatalog | None = None
) -> MappedOp:
    """Kernel type and slots of a top-level operator (see the module docstring for the rules)."""
    if descendants is None:
        descendants = op.descendants()
    if catalog is None:
        catalog = current_catalog()
    mapped = _mapped(op, descendants, catalog)
    if mapped is not None:
        return _with_strides(mapped, op)
    if short_name(op.name) in COMPOSITES:
        candidates = [(m, d) for d in descendants if (m := _mapped(d, d.descendants(), catalog)) is not None]
        primary = catalog.trace_primary
        preferred = [(m, d) for m, d in candidates if m.kernel_type in primary]
        if preferred or candidates:
            chosen, callee = (preferred or candidates)[0]
            return _with_strides(chosen, callee)
    return _fallback(op)


def _with_strides(mapped: MappedOp, op: TraceOp) -> MappedOp:
    """The recorded strides of the operator's tensors, where the row's input slots are those
    tensors in order (a mapping that reshapes or adds slots keeps none: its rows are contiguous)."""
    if mapped.strides:
        return mapped
    tensors = iter(tensor_args(op))
    strides: list[Shape | None] = []
    for slot in mapped.inputs:
        if slot.shape is None:
            strides.append(None)
            continue
        tensor = next(tensors, None)
        if tensor is None or tensor.shape != slot.shape:
            return mapped
        strides.append(tensor.strides)
    return dataclasses.replace(mapped, strides=tuple(strides))
