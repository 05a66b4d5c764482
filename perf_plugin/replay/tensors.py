"""Tensor specs from database rows, and random tensors built from them.

Dtype spellings follow the real Ascend profiler files (``DT_BF16``, ``FLOAT``, ``FLOAT16``,
``INT64`` ...) and are normalised by ``perf_plugin.database.signature.normalise_dtype``; CUDA and
CPU databases written by this project use the same names.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from perf_plugin.database.errors import DatabaseError, IncompleteRow
from perf_plugin.database.schema import INPUT_STRIDES
from perf_plugin.database.shapes import Shape, numel, parse_shape_cell, split_slots
from perf_plugin.database.signature import normalise_dtype, normalise_format
from perf_plugin.trace.args import is_contiguous

if TYPE_CHECKING:  # torch is imported lazily: collection and ingest must not pay for it
    import torch

# normalised dtype name -> (torch dtype attribute, element size in bytes)
DTYPES: Mapping[str, tuple[str, int]] = MappingProxyType(
    {
        "FLOAT": ("float32", 4),
        "FLOAT32": ("float32", 4),
        "FP32": ("float32", 4),
        "FLOAT16": ("float16", 2),
        "FP16": ("float16", 2),
        "HALF": ("float16", 2),
        "BF16": ("bfloat16", 2),
        "BFLOAT16": ("bfloat16", 2),
        "DOUBLE": ("float64", 8),
        "FLOAT64": ("float64", 8),
        "INT8": ("int8", 1),
        "UINT8": ("uint8", 1),
        "INT16": ("int16", 2),
        "INT32": ("int32", 4),
        "INT64": ("int64", 8),
        "BOOL": ("bool", 1),
        "COMPLEX64": ("complex64", 8),
        # Quantisation rows: the packed dequantisation scale of QuantBatchMatmulV3
        # (``npu_trans_quant_param`` output, seen by the kernel as UINT64), the Ascend 950
        # float8 operands/outputs, and HIFLOAT8, which torch_npu carries in uint8 storage
        # (torch has no such dtype; no replay computes with it, the rows only parse).
        "UINT64": ("uint64", 8),
        "FLOAT8_E4M3FN": ("float8_e4m3fn", 1),
        "FLOAT8_E5M2": ("float8_e5m2", 1),
        "HIFLOAT8": ("uint8", 1),
        # The rest of CANN 8.x's data types (ge::DataType / aclDataType), so that every row a
        # profiler writes parses: UINT16 is the argmax mask of Ascend's max pooling
        # (MaxPoolWithArgmaxV1), UINT32 a counter type.  Types torch has map to it; packed
        # sub-byte, quantised and non-numeric types to the storage torch_npu gives them (a row of
        # such a type parses, and a replay that cannot compute with it says so).
        "UINT16": ("uint16", 2),
        "UINT32": ("uint32", 4),
        "COMPLEX32": ("complex32", 4),
        "COMPLEX128": ("complex128", 16),
        "FLOAT8_E8M0": ("float8_e8m0fnu", 1),
        "INT4": ("uint8", 1),
        "INT2": ("uint8", 1),
        "UINT2": ("uint8", 1),
        "UINT1": ("uint8", 1),
        "FLOAT4_E2M1": ("uint8", 1),
        "FLOAT4_E1M2": ("uint8", 1),
        "FLOAT6_E3M2": ("uint8", 1),
        "FLOAT6_E2M3": ("uint8", 1),
        "QINT8": ("int8", 1),
        "QUINT8": ("uint8", 1),
        "QINT16": ("int16", 2),
        "QUINT16": ("uint16", 2),
        "QINT32": ("int32", 4),
        "DUAL_SUB_INT8": ("int8", 1),
        "DUAL_SUB_UINT8": ("uint8", 1),
        "DUAL": ("uint8", 1),
        "STRING": ("uint8", 1),
        "STRING_REF": ("uint8", 1),
        "RESOURCE": ("uint8", 1),
        "VARIANT": ("uint8", 1),
    }
)
FLOATING = frozenset(
    {"FLOAT", "FLOAT32", "FP32", "FLOAT16", "FP16", "HALF", "BF16", "BFLOAT16", "DOUBLE", "FLOAT64"}
    | {"FLOAT8_E4M3FN", "FLOAT8_E5M2"}
)
# Floating dtypes torch cannot draw ``uniform_`` in (float8): drawn in float32, then cast.
_DRAWN_IN_FLOAT32 = frozenset({"FLOAT8_E4M3FN", "FLOAT8_E5M2"})
# A complex dtype's parts, by the dtype name its row spells.
_COMPLEX_PARTS = {"complex32": "FLOAT16", "complex64": "FLOAT", "complex128": "DOUBLE"}


@dataclass(frozen=True, slots=True)  # one or more per collected row
class TensorSpec:
    """One slot of a row: shape (None for an empty slot), normalised dtype and format, and the
    strides of an input a trace recorded as not contiguous (a view the kernel read in place)."""

    shape: Shape | None
    dtype: str
    format: str = ""
    strides: Shape | None = None

    @property
    def storage_numel(self) -> int:
        """Elements of the storage the strided view spans (its own count when contiguous)."""
        if self.shape is None:
            return 0
        if self.strides is None:
            return self.numel
        if any(size == 0 for size in self.shape):
            return 0
        return 1 + sum((size - 1) * stride for size, stride in zip(self.shape, self.strides))

    @property
    def present(self) -> bool:
        return self.shape is not None

    @property
    def numel(self) -> int:
        return numel(self.shape) if self.shape is not None else 0

    @property
    def nbytes(self) -> int:
        if self.shape is None or self.dtype not in DTYPES:
            return 0
        return self.numel * DTYPES[self.dtype][1]

    def torch_dtype(self) -> "torch.dtype":
        import torch

        try:
            dtype: torch.dtype = getattr(torch, DTYPES[self.dtype][0])
            return dtype
        except KeyError:
            raise DatabaseError(f"unknown dtype {self.dtype!r}") from None


@dataclass(frozen=True, slots=True)  # one per collected row
class KernelRow:
    """What a replay sees of a database row: its kernel type and parsed tensor slots."""

    kernel_type: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attrs: Mapping[str, str] = field(default_factory=dict)

    @property
    def present_inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(s for s in self.inputs if s.present)

    @property
    def present_outputs(self) -> tuple[TensorSpec, ...]:
        return tuple(s for s in self.outputs if s.present)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.inputs) + sum(s.nbytes for s in self.outputs)


_COLUMNS = {
    "inputs": ("Input Shapes", "Input Data Types", "Input Formats"),
    "outputs": ("Output Shapes", "Output Data Types", "Output Formats"),
}


def _strides(row: Mapping[str, str], side: str, shapes: list[Shape | None]) -> list[Shape | None]:
    """The recorded strides of the input slots (``Input Strides``), None where the cell has none."""
    cell = row.get(INPUT_STRIDES, "") if side == "inputs" else ""
    try:
        strides = parse_shape_cell(cell)
    except DatabaseError as exc:
        raise exc.located(column=INPUT_STRIDES) from None
    aligned: list[Shape | None] = []
    for i, shape in enumerate(shapes):
        recorded = strides[i] if i < len(strides) else None
        if recorded is not None and (shape is None or len(recorded) != len(shape)):
            raise DatabaseError(f"slot {i} strides {list(recorded)} do not match its shape", column=INPUT_STRIDES)
        aligned.append(None if recorded is None or is_contiguous(shape or (), recorded) else recorded)
    return aligned


def _specs(row: Mapping[str, str], side: str) -> tuple[TensorSpec, ...]:
    shape_col, dtype_col, format_col = _COLUMNS[side]
    try:
        shapes = parse_shape_cell(row.get(shape_col, ""))
    except DatabaseError as exc:
        raise exc.located(column=shape_col) from None
    strides = _strides(row, side, shapes)
    dtypes = [normalise_dtype(t) for t in split_slots(row.get(dtype_col, ""))]
    formats = [normalise_format(t) for t in split_slots(row.get(format_col, ""))]
    specs = []
    for i, shape in enumerate(shapes):
        dtype = dtypes[i] if i < len(dtypes) else ""
        if shape is not None:
            if not dtype:
                raise IncompleteRow(f"slot {i} has a shape but no data type", column=dtype_col)
            if dtype not in DTYPES:
                raise DatabaseError(
                    f"unknown dtype {dtype!r} in slot {i} (known: {', '.join(sorted(DTYPES))})",
                    column=dtype_col,
                )
        specs.append(_shared_spec(shape, dtype, formats[i] if i < len(formats) else "", strides[i]))
    return tuple(specs)


# Equal slots share one spec: a grid's rows repeat their weights', caches' and scales' slots
# across every token count.  Bounded, so a long-lived process does not keep every spec it saw.
_shared_spec = functools.lru_cache(maxsize=1 << 16)(TensorSpec)


def shape_text(value: "TensorSpec | Sequence[int] | None") -> str:
    """``[4096,1024]`` for messages; ``(empty)`` for an empty slot."""
    shape = value.shape if isinstance(value, TensorSpec) else value
    return "(empty)" if shape is None else "[" + ",".join(str(d) for d in shape) + "]"


def kernel_row_from_cells(kernel_type: str, row: Mapping[str, str]) -> KernelRow:
    """Parse a row's identity cells; raises DatabaseError naming the column on bad input."""
    return KernelRow(kernel_type, _specs(row, "inputs"), _specs(row, "outputs"), dict(row))


def random_tensor(
    spec: TensorSpec,
    device: "torch.device | str",
    generator: "torch.Generator | None" = None,
    *,
    low: int = 1,
    high: int = 100,
) -> "torch.Tensor":
    """Fresh random values, never zeros: floats uniform in +-[0.5, 1.5], ints in [low, high).

    A spec with recorded strides gets a view with those strides over a storage drawn the same way.
    """
    if spec.shape is None:
        raise DatabaseError("cannot build a tensor for an empty slot")
    if spec.strides is None:
        return _random_values(spec, device, generator, low, high)
    storage = _random_values(TensorSpec((spec.storage_numel,), spec.dtype), device, generator, low, high)
    return storage.as_strided(spec.shape, spec.strides)


def _random_values(
    spec: TensorSpec, device: "torch.device | str", generator: "torch.Generator | None", low: int, high: int
) -> "torch.Tensor":
    import torch

    assert spec.shape is not None
    dtype = spec.torch_dtype()
    if spec.dtype in FLOATING:
        # Generated on the target device (the generator must live there too) and in the
        # target dtype; uniform in +-[0.5, 1.5] keeps every element away from zero and bounded.
        # Three kernels: the magnitudes, signs drawn as -1 or 0 (copysign reads 0 as +), and
        # the copysign.  On CUDA every kernel a case launches is a profiler event costing tens
        # of microseconds of host time (this ran as seven: rand, add, randint, two integer
        # ops, mul, cast); drawing a half-precision tensor through float32 held 3x its bytes
        # at the peak (1.5x now) and took 1.5-2x as long on the CPU.
        draw_dtype = torch.float32 if spec.dtype in _DRAWN_IN_FLOAT32 else dtype
        values = torch.empty(spec.shape, device=device, dtype=draw_dtype)
        values.uniform_(0.5, 1.5, generator=generator)
        signs = torch.randint(-1, 1, spec.shape, generator=generator, device=device, dtype=torch.int8)
        values.copysign_(signs)
        return values if draw_dtype == dtype else values.to(dtype)
    if spec.dtype == "BOOL":
        return torch.randint(0, 2, spec.shape, generator=generator, device=device).bool()
    if dtype.is_complex:  # real and imaginary parts, each drawn as a float of their width is
        parts = TensorSpec((*spec.shape, 2), _COMPLEX_PARTS[str(dtype).removeprefix("torch.")])
        return torch.view_as_complex(_random_values(parts, device, generator, low, high))
    return torch.randint(low, high, spec.shape, generator=generator, device=device, dtype=dtype)
