"""Arguments of a profiled PyTorch operator: tensors, scalars, dtypes, and how they combine.

``record_shapes=True`` makes the profiler record, per operator argument, its dims (``Input
Dims``; a list of dims for a tensor list), its element type name (``Input type``: ``float``,
``c10::BFloat16``, ``long int``, or ``Scalar`` / ``ScalarList`` / ``TensorList`` for
non-tensors, ``""`` for ``None``) and, for scalars, the value (``Concrete Inputs``).  This module
reads them and applies PyTorch's broadcasting and type-promotion rules, in the Ascend dtype
spelling the database uses.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeGuard

from perf_plugin.trace.events import TraceOp

Shape = tuple[int, ...]

# Element type names as the profiler writes them (c10 TypeMeta names) -> Ascend spelling.
TRACE_DTYPES: dict[str, str] = {
    "float": "FLOAT",
    "double": "DOUBLE",
    "c10::Half": "FLOAT16",
    "c10::BFloat16": "DT_BF16",
    "long int": "INT64",
    "long": "INT64",
    "long long": "INT64",
    "int": "INT32",
    "short int": "INT16",
    "short": "INT16",
    "signed char": "INT8",
    "unsigned char": "UINT8",
    "bool": "BOOL",
    "c10::complex<float>": "COMPLEX64",
    "c10::complex<double>": "COMPLEX128",
    "c10::Float8_e4m3fn": "FLOAT8_E4M3FN",
    "c10::Float8_e5m2": "FLOAT8_E5M2",
}
# at::ScalarType codes, as ``dtype`` arguments appear among the concrete inputs.
SCALAR_TYPE_CODES: dict[int, str] = {
    0: "UINT8",
    1: "INT8",
    2: "INT16",
    3: "INT32",
    4: "INT64",
    5: "FLOAT16",
    6: "FLOAT",
    7: "DOUBLE",
    9: "COMPLEX64",
    10: "COMPLEX128",
    11: "BOOL",
    15: "DT_BF16",
    23: "FLOAT8_E5M2",
    24: "FLOAT8_E4M3FN",
}
# torch dtype names (``str(torch.bfloat16)`` without ``torch.``) -> Ascend spelling.
TORCH_DTYPE_NAMES: dict[str, str] = {
    "float32": "FLOAT", "float64": "DOUBLE", "float16": "FLOAT16", "bfloat16": "DT_BF16",
    "int64": "INT64", "int32": "INT32", "int16": "INT16", "int8": "INT8", "uint8": "UINT8",
    "bool": "BOOL", "complex64": "COMPLEX64", "complex128": "COMPLEX128",
    "float8_e4m3fn": "FLOAT8_E4M3FN", "float8_e5m2": "FLOAT8_E5M2",
}  # fmt: skip
NON_TENSOR_TYPES = frozenset({"", "Scalar", "ScalarList", "TensorList", "GenericList", "None", "Device", "Layout"})

_FLOATING_RANK = {"FLOAT16": 1, "DT_BF16": 1, "FLOAT": 2, "DOUBLE": 3}
_INTEGER_RANK = {"UINT8": 1, "INT8": 1, "INT16": 2, "INT32": 3, "INT64": 4}
_COMPLEX_RANK = {"COMPLEX64": 1, "COMPLEX128": 2}
DEFAULT_FLOAT = "FLOAT"


def trace_dtype(name: str) -> str:
    """Profiler element-type name -> Ascend spelling ('' when unknown)."""
    name = name.strip()
    if name in TRACE_DTYPES:
        return TRACE_DTYPES[name]
    if not name or name in NON_TENSOR_TYPES:
        return ""
    return re.sub(r"[^A-Za-z0-9_]", "_", name.replace("c10::", "")).upper()


def concrete_value(value: Any) -> Any:
    """A concrete input as written in a JSON trace ("15", "[4, 32]", "False") -> a Python value."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return None
    return text


@dataclass(frozen=True)
class Tensor:
    shape: Shape
    dtype: str
    strides: Shape | None = None  # as recorded (``Input Strides``); None when the trace has none

    @property
    def contiguous(self) -> bool:
        return self.strides is None or is_contiguous(self.shape, self.strides)

    @property
    def rank(self) -> int:
        return len(self.shape)


def is_int_list(value: Any) -> TypeGuard[list[int] | tuple[int, ...]]:
    return isinstance(value, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) for d in value)


def tensor_arg(op: TraceOp, index: int) -> Tensor | None:
    """Argument ``index`` if it is a tensor (0-dim tensors included), else None."""
    if index >= len(op.types) or index >= len(op.dims):
        return None
    kind = op.types[index]
    dims = op.dims[index]
    if kind in NON_TENSOR_TYPES or not is_int_list(dims):
        return None
    strides = op.strides[index] if index < len(op.strides) else None
    recorded = tuple(strides) if is_int_list(strides) and len(strides) == len(dims) else None
    return Tensor(tuple(dims), trace_dtype(kind), recorded)


def contiguous_strides(shape: Shape) -> Shape:
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def is_contiguous(shape: Shape, strides: Shape) -> bool:
    """Row-major without gaps; the stride of a dimension of size 1 does not matter."""
    expected = contiguous_strides(shape)
    return all(size == 1 or stride == want for size, stride, want in zip(shape, strides, expected))


def tensor_args(op: TraceOp) -> list[Tensor]:
    """The operator's tensor arguments, in argument order."""
    return [tensor for index in range(len(op.types)) if (tensor := tensor_arg(op, index)) is not None]


def tensor_list_arg(op: TraceOp, index: int) -> list[Tensor] | None:
    if index >= len(op.types) or index >= len(op.dims) or op.types[index] != "TensorList":
        return None
    dims = op.dims[index]
    if not isinstance(dims, list) or not all(is_int_list(d) for d in dims):
        return None
    # exported traces record a list's strides as a list per element (``[[16384, 2048, 32, 1], ...]``)
    listed = op.strides[index] if index < len(op.strides) else None
    strides = listed if isinstance(listed, list) and len(listed) == len(dims) else [None] * len(dims)
    dtypes = op.list_dtypes.get(index, ())
    dtypes = dtypes if len(dtypes) == len(dims) else ("",) * len(dims)
    return [
        Tensor(tuple(d), dtype, tuple(s) if is_int_list(s) and len(s) == len(d) else None)
        for d, s, dtype in zip(dims, strides, dtypes)
    ]


def concrete_arg(op: TraceOp, index: int) -> Any:
    return concrete_value(op.concrete[index]) if index < len(op.concrete) else None


def is_scalar_arg(op: TraceOp, index: int) -> bool:
    """A Python number or a 0-dim tensor (what ``x * 2.0`` passes)."""
    if index >= len(op.types):
        return False
    if op.types[index] == "Scalar":
        return True
    tensor = tensor_arg(op, index)
    return tensor is not None and tensor.rank == 0


def scalar_dtype(op: TraceOp, index: int) -> str:
    if op.types[index] == "Scalar":
        value = concrete_arg(op, index)
        if isinstance(value, bool):
            return "BOOL"
        if isinstance(value, int):
            return "INT64"
        return "DOUBLE"
    tensor = tensor_arg(op, index)
    return tensor.dtype if tensor is not None else ""


def broadcast(a: Shape, b: Shape) -> Shape | None:
    result = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + a), reversed((1,) * (len(a) - len(b)) + b)):
        if x != y and 1 not in (x, y):
            return None
        result.append(y if x == 1 else x)
    return tuple(reversed(result))


def category(dtype: str) -> int:
    if dtype == "BOOL":
        return 0
    if dtype in _INTEGER_RANK:
        return 1
    if dtype in _FLOATING_RANK:
        return 2
    if dtype in _COMPLEX_RANK:
        return 3
    return -1


def _wider(a: str, b: str) -> str:
    """The wider of two dtypes of one category."""
    if a == b:
        return a
    if {a, b} == {"FLOAT16", "DT_BF16"}:
        return "FLOAT"
    if {a, b} == {"UINT8", "INT8"}:
        return "INT16"
    for ranks in (_FLOATING_RANK, _INTEGER_RANK, _COMPLEX_RANK):
        if a in ranks and b in ranks:
            return a if ranks[a] >= ranks[b] else b
    return a


def promote(a: Tensor, b_dtype: str, b_is_dimensioned: bool) -> str:
    """PyTorch's result type of a binary op: dimensioned tensors decide within a category;
    0-dim tensors and Python scalars only lift the category (``int_tensor * 2.5`` -> FLOAT)."""
    if not a.dtype or not b_dtype:
        return ""
    ca, cb = category(a.dtype), category(b_dtype)
    if ca < 0 or cb < 0:
        return ""
    if b_is_dimensioned:
        if ca == cb:
            return _wider(a.dtype, b_dtype)
        return a.dtype if ca > cb else b_dtype
    if cb > ca:
        return DEFAULT_FLOAT if cb == 2 else ("COMPLEX64" if cb == 3 else b_dtype)
    return a.dtype
