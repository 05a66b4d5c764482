"""A top-level PyTorch operator -> a database row's kernel type and identity cells.

Kernel types
------------
A row is named after its top-level operator.  Where the same computation has an Ascend kernel
type with a replay, that name is used, so a GPU or CPU profile becomes a database the same
replays run on:

=========================================================  ==================================
operator (``aten::``)                                      kernel type
=========================================================  ==================================
``mm``, ``addmm``, ``linear``, ``matmul`` (2-D GEMM)       ``MatMulV2``
``bmm``, ``matmul`` (3-D x 3-D, same batch)                ``BatchMatMulV2``
``add``/``add_``, ``sub``/``sub_``                         ``Add``, ``Sub``
``mul``/``mul_`` (tensor x tensor / tensor x scalar)       ``Mul`` / ``Muls``
``div``/``div_`` (true division)                           ``RealDiv``
``_to_copy``, ``to`` (dtype changes)                       ``Cast``
``softmax``, ``_softmax``                                  ``SoftmaxV2``
``cat``                                                    ``ConcatD``
``embedding``, ``index_select`` (dim 0)                    ``GatherV2``
``clone``, ``contiguous`` (when it copies)                 ``TensorMove``
``rms_norm``, ``_fused_rms_norm`` (with a weight)          ``RmsNorm``
=========================================================  ==================================

Slots follow the Ascend kernel's layout: ``MatMulV2`` is ``x1;x2[;bias]`` (``linear`` with an
input of rank > 2 runs one 2-D GEMM, recorded as ``[prod(leading dims), K]``); ``GatherV2`` is
``x;indices;axis`` with ``axis`` a 1-element INT64 tensor; ``RmsNorm`` outputs ``y;rstd`` with
``rstd`` FLOAT of the input's shape reduced to 1 over the normalised dims; a tensor-scalar
``Add``/``Sub``/``RealDiv`` keeps the scalar as an empty second slot carrying its dtype, as Ascend
profiles record tensor-scalar ``Mul`` (``1000;`` / ``FLOAT;FLOAT``).

A top-level operator that is only a wrapper (``matmul`` of 4-D tensors, ``einsum``,
``reshape``, ``flatten``, ``type_as``) is named after the mapped operator it called, which is the
kernel that did the work (a 4-D ``matmul`` runs a ``bmm``).  Every other operator keeps its own
name with ``::`` turned into ``.`` and other characters outside ``[A-Za-z0-9_.-]`` into ``_``
(``aten::gelu`` -> ``aten.gelu``, ``vllm::rms_norm`` -> ``vllm.rms_norm``).

Dtypes and formats
------------------
Dtypes are written in the Ascend spelling (``DT_BF16, FLOAT, FLOAT16, DOUBLE, INT64, INT32,
INT16, INT8, UINT8, BOOL``) and every slot's format is ``ND``; ``OP State`` is ``dynamic``.

Output cells
------------
The trace records inputs only.  Outputs are derived where the inputs determine them: the
GEMMs; broadcasting and PyTorch's type promotion for binary elementwise ops; the cast's target
dtype (its ``dtype`` argument, else the dtype of the copy it ran); softmax (with its ``dtype``
argument); cat (the sum along ``dim``); gather; copies; RmsNorm; unary elementwise ops that keep
the input's shape (``gelu``, ``silu``, ``relu`` ...); comparisons (BOOL, broadcast shape); and
factories (``randn``, ``zeros`` ...: the ``size`` argument, and the ``dtype`` argument or FLOAT).
Where outputs cannot be derived (an operator outside these rules, or dims the profiler did not
record) the three output cells are left empty: the row keeps its measurement and inputs and has
no replay until a rule derives them.  The profiler records no dtypes for tensors passed in a
list (``cat``'s inputs); those dtype slots are left empty rather than guessed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perf_plugin.database.shapes import QuoteStyle, format_shape_cell
from perf_plugin.ingest.trace_args import (
    DEFAULT_FLOAT,
    SCALAR_TYPE_CODES,
    Shape,
    Tensor,
    broadcast,
    category,
    concrete_arg,
    is_int_list,
    is_scalar_arg,
    promote,
    scalar_dtype,
    tensor_arg,
    tensor_list_arg,
)
from perf_plugin.ingest.trace_events import TraceOp

# Operators that do no work of their own (views, allocation, metadata).  A top-level operator
# from this set whose callees are all in it too launched nothing and is not a database row.
NO_WORK: frozenset[str] = frozenset(
    {
        "alias", "as_strided", "_reshape_alias", "view", "_unsafe_view", "view_as", "reshape", "flatten",
        "unflatten", "t", "transpose", "permute", "expand", "expand_as", "slice", "select", "squeeze",
        "unsqueeze", "unbind", "split", "split_with_sizes", "chunk", "narrow", "movedim", "diagonal",
        "detach", "detach_", "lift_fresh", "resolve_conj", "resolve_neg", "conj", "_conj", "real", "imag",
        "empty", "empty_like", "empty_strided", "size", "stride", "numel", "dim", "is_nonzero",
        "result_type", "to", "type_as", "contiguous", "set_", "record_stream", "_local_scalar_dense", "item",
        "numpy_T", "mT", "mH", "adjoint", "swapaxes", "swapdims", "moveaxis", "unfold", "view_as_real",
        "view_as_complex",
    }
)
# Wrappers named after the mapped operator they called (see the module docstring).
COMPOSITES: frozenset[str] = frozenset(
    {"matmul", "einsum", "reshape", "flatten", "type_as", "linear", "tensordot"}
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


@dataclass(frozen=True)
class Slot:
    shape: Shape | None  # None: an empty slot (a scalar, or an absent optional input)
    dtype: str


@dataclass(frozen=True)
class MappedOp:
    kernel_type: str
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]

    def cells(self, accelerator_core: str) -> dict[str, str]:
        return {
            "OP State": "dynamic",
            "Accelerator Core": accelerator_core,
            "Input Shapes": _shapes(self.inputs),
            "Input Data Types": ";".join(s.dtype for s in self.inputs),
            "Input Formats": ";".join("ND" for _ in self.inputs),
            "Output Shapes": _shapes(self.outputs),
            "Output Data Types": ";".join(s.dtype for s in self.outputs),
            "Output Formats": ";".join("ND" for _ in self.outputs),
        }


def _shapes(slots: Sequence[Slot]) -> str:
    return format_shape_cell([s.shape for s in slots], QuoteStyle.EMBEDDED) if slots else ""


def short_name(name: str) -> str:
    return name[len("aten::") :] if name.startswith("aten::") else ""


def sanitise_operator_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name.replace("::", ".")).strip("._") or "unnamed"


def _gemm_out(a: Shape, b: Shape) -> Shape | None:
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return (a[0], b[1])
    return None


Mapper = Callable[[TraceOp, list[TraceOp]], "MappedOp | None"]


def _mm(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    a, b = tensor_arg(op, 0), tensor_arg(op, 1)
    if a is None or b is None:
        return None
    out = _gemm_out(a.shape, b.shape)
    if out is None:
        return None
    return MappedOp("MatMulV2", (Slot(a.shape, a.dtype), Slot(b.shape, b.dtype)), (Slot(out, a.dtype),))


def _addmm(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    bias, a, b = tensor_arg(op, 0), tensor_arg(op, 1), tensor_arg(op, 2)
    if a is None or b is None or bias is None:
        return None
    out = _gemm_out(a.shape, b.shape)
    if out is None:
        return None
    slots = (Slot(a.shape, a.dtype), Slot(b.shape, b.dtype), Slot(bias.shape, bias.dtype))
    return MappedOp("MatMulV2", slots, (Slot(out, a.dtype),))


def _linear(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    x, weight, bias = tensor_arg(op, 0), tensor_arg(op, 1), tensor_arg(op, 2)
    if x is None or weight is None or x.rank < 2 or weight.rank != 2 or x.shape[-1] != weight.shape[1]:
        return None
    rows = math.prod(x.shape[:-1])
    slots = [Slot((rows, x.shape[-1]), x.dtype), Slot(weight.shape, weight.dtype)]
    if bias is not None:
        slots.append(Slot(bias.shape, bias.dtype))
    return MappedOp("MatMulV2", tuple(slots), (Slot((rows, weight.shape[0]), x.dtype),))


def _matmul(op: TraceOp, descendants: list[TraceOp]) -> MappedOp | None:
    a, b = tensor_arg(op, 0), tensor_arg(op, 1)
    if a is None or b is None:
        return None
    if a.rank == 2 and b.rank == 2:
        return _mm(op, descendants)
    if a.rank > 2 and b.rank == 2 and a.shape[-1] == b.shape[0]:
        rows = math.prod(a.shape[:-1])
        return MappedOp(
            "MatMulV2",
            (Slot((rows, a.shape[-1]), a.dtype), Slot(b.shape, b.dtype)),
            (Slot((rows, b.shape[1]), a.dtype),),
        )
    if a.rank == 3 and b.rank == 3:
        return _bmm(op, descendants)
    return None


def _bmm(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    a, b = tensor_arg(op, 0), tensor_arg(op, 1)
    if a is None or b is None or a.rank != 3 or b.rank != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        return None
    out = (a.shape[0], a.shape[1], b.shape[2])
    return MappedOp("BatchMatMulV2", (Slot(a.shape, a.dtype), Slot(b.shape, b.dtype)), (Slot(out, a.dtype),))


def _binary(kernel_type: str, scalar_kernel_type: str | None = None, true_division: bool = False) -> Mapper:
    def mapper(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
        a = tensor_arg(op, 0)
        if a is None or a.rank == 0 or len(op.types) < 2:
            return None
        if true_division and concrete_arg(op, 2) not in (None,):
            return None  # div with rounding_mode is floor/trunc division, not RealDiv
        if is_scalar_arg(op, 1):
            dtype = promote(a, scalar_dtype(op, 1), b_is_dimensioned=False)
            if true_division and category(dtype) in (0, 1):
                dtype = DEFAULT_FLOAT
            out = (Slot(a.shape, dtype),)
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


def _cast(op: TraceOp, descendants: list[TraceOp]) -> MappedOp | None:
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


def _softmax(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
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


def _cat(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    tensors = tensor_list_arg(op, 0)
    if not tensors:
        return None
    # Legacy behaviour: 1-D empty tensors are skipped by cat.
    shaped = [t for t in tensors if t.shape != (0,)] or tensors
    rank = shaped[0].rank
    dim = concrete_arg(op, 1)
    dim = 0 if dim is None else dim
    outputs: tuple[Slot, ...] = ()
    if isinstance(dim, int) and rank > 0 and all(t.rank == rank for t in shaped):
        dim = dim % rank
        out = list(shaped[0].shape)
        out[dim] = sum(t.shape[dim] for t in shaped)
        outputs = (Slot(tuple(out), ""),)
    return MappedOp("ConcatD", tuple(Slot(t.shape, "") for t in tensors), outputs)


def _gather(weight: Tensor, indices: Tensor) -> MappedOp:
    out = indices.shape + weight.shape[1:]
    return MappedOp(
        "GatherV2",
        (Slot(weight.shape, weight.dtype), Slot(indices.shape, indices.dtype), Slot((1,), "INT64")),
        (Slot(out, weight.dtype),),
    )


def _embedding(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    weight, indices = tensor_arg(op, 0), tensor_arg(op, 1)
    if weight is None or indices is None or weight.rank != 2:
        return None
    return _gather(weight, indices)


def _index_select(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    x, dim, index = tensor_arg(op, 0), concrete_arg(op, 1), tensor_arg(op, 2)
    if x is None or index is None or not isinstance(dim, int) or x.rank == 0:
        return None
    if dim % x.rank != 0:
        return None
    return _gather(x, index)


def _tensor_move(op: TraceOp, descendants: list[TraceOp]) -> MappedOp | None:
    x = tensor_arg(op, 0)
    if x is None:
        return None
    if op.name == "aten::contiguous" and not any(d.name in ("aten::clone", "aten::copy_") for d in descendants):
        return None
    return MappedOp("TensorMove", (Slot(x.shape, x.dtype),), (Slot(x.shape, x.dtype),))


def _rms_norm(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    x, weight = tensor_arg(op, 0), tensor_arg(op, 2)
    if x is None or weight is None or x.rank == 0:
        return None
    normalized = concrete_arg(op, 1)
    dims = len(normalized) if isinstance(normalized, list) and normalized else weight.rank
    dims = max(1, min(dims, x.rank))
    rstd = x.shape[:-dims] + (1,) * dims
    return MappedOp(
        "RmsNorm",
        (Slot(x.shape, x.dtype), Slot(weight.shape, weight.dtype)),
        (Slot(x.shape, x.dtype), Slot(rstd, "FLOAT")),
    )


MAPPERS: dict[str, Mapper] = {
    "mm": _mm,
    "addmm": _addmm,
    "linear": _linear,
    "matmul": _matmul,
    "bmm": _bmm,
    "add": _binary("Add"),
    "add_": _binary("Add"),
    "sub": _binary("Sub"),
    "sub_": _binary("Sub"),
    "mul": _binary("Mul", "Muls"),
    "mul_": _binary("Mul", "Muls"),
    "div": _binary("RealDiv", true_division=True),
    "div_": _binary("RealDiv", true_division=True),
    "_to_copy": _cast,
    "to": _cast,
    "softmax": _softmax,
    "_softmax": _softmax,
    "cat": _cat,
    "embedding": _embedding,
    "index_select": _index_select,
    "clone": _tensor_move,
    "contiguous": _tensor_move,
    "rms_norm": _rms_norm,
    "_fused_rms_norm": _rms_norm,
}
_PRIMARY = ("MatMulV2", "BatchMatMulV2")


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


def _mapped(op: TraceOp, descendants: list[TraceOp]) -> MappedOp | None:
    mapper = MAPPERS.get(short_name(op.name))
    return mapper(op, descendants) if mapper is not None else None


def _fallback(op: TraceOp) -> MappedOp:
    inputs: list[Slot] = []
    for i in range(len(op.types)):
        tensor = tensor_arg(op, i)
        if tensor is not None:
            inputs.append(Slot(tensor.shape, tensor.dtype))
            continue
        for item in tensor_list_arg(op, i) or []:
            inputs.append(Slot(item.shape, item.dtype))
    outputs: tuple[Slot, ...] = ()
    first = tensor_arg(op, 0)
    name = short_name(op.name)
    if first is not None and name in SAME_AS_FIRST_INPUT:
        dtype = first.dtype
        if name in _FLOAT_RESULT and category(dtype) in (0, 1):
            dtype = DEFAULT_FLOAT
        outputs = (Slot(first.shape, dtype),)
    elif first is not None and name in COMPARISONS:
        other = tensor_arg(op, 1)
        shape = broadcast(first.shape, other.shape) if other is not None else first.shape
        outputs = (Slot(shape, "BOOL"),) if shape is not None else ()
    elif name in FACTORY_DTYPE_ARGUMENT and is_int_list(size := concrete_arg(op, 0)):
        code = concrete_arg(op, FACTORY_DTYPE_ARGUMENT[name])
        dtype = SCALAR_TYPE_CODES.get(code, DEFAULT_FLOAT) if isinstance(code, int) else DEFAULT_FLOAT
        outputs = (Slot(tuple(size), dtype),)
    return MappedOp(sanitise_operator_name(op.name), tuple(inputs), outputs)


def map_operator(op: TraceOp, descendants: list[TraceOp] | None = None) -> MappedOp:
    """Kernel type and slots of a top-level operator (see the module docstring for the rules)."""
    if descendants is None:
        descendants = op.descendants()
    mapped = _mapped(op, descendants)
    if mapped is not None:
        return mapped
    if short_name(op.name) in COMPOSITES:
        candidates = [m for d in descendants if (m := _mapped(d, d.descendants())) is not None]
        primary = [m for m in candidates if m.kernel_type in _PRIMARY]
        if primary or candidates:
            return (primary or candidates)[0]
    return _fallback(op)
