"""The Ascend performance model's compute lookup, re-implemented to read the files we write.

The reader is msmodeling's ``ProfilingDataSource`` (repository Ascend/msmodeling, file
``tensor_cast/performance_model/profiling_database/profiling_data_source.py``).  This module
follows its compute path as read in three versions of that file, which differ in how they pick
a row's latency:

``8a2288d`` (commit 8a2288d1905a70a3b566668044eb9a6c4ffd31eb)
    one latency column per file, the first of ``Average Duration(us)``, ``Profiling Average
    Duration(us)`` present (else ``Duration(us)``), read on every row even where it is empty
    (the value is then NaN); the first row that matches wins.
``1293ea5`` (commit 1293ea52926bc649d8c801d98008cef18a1ffd88)
    the file's column first, then the other two in that order, per row: the first finite
    positive value; a row with none is skipped; the first row that matches wins.
``a1c842e`` (commit a1c842ec67e2877c046f7d109bd63fdcbc114c77)
    as ``1293ea5``, but every matching row is scored (shape distance: 1 when a padding rule
    matched; the kernel type's place in the mapping's list; the latency column's place in the
    preference, or profiled rows first where ``latency_policy`` says ``prefer_profiling_rows``)
    and the lowest score wins, the first row among equals.

Common to all three: ``data_dir/op_mapping.yaml`` maps the model's operator to a kernel type
(and alternates, tried in order); ``data_dir/{KernelType}.csv`` is read with ``pandas.read_csv``
and its defaults; a row matches when its ``Input Shapes`` (``;`` between slots, ``,`` between
dims, surrounding ``"`` stripped, empty slots dropped) and ``Input Data Types`` (``;``) agree
with the operator's tensor inputs slot by slot, dtypes through ``DTYPE_MAP``, a ``FRACTAL_NZ``
entry of ``Input Formats`` restored to its ND shape first.  Shape rules implemented: identity,
a leading 1 stripped, the matmul weight transposed, block padding and the 3-D flattening of
quantize/norm kernels.  Not implemented (no kernel type the tests read uses them): the RoPE,
SwiGlu and ReshapeAndCache input rewrites, the relaxed dtype groups, the ``Index`` and batched
matmul rules of ``a1c842e``, the elementwise / attention / MoE / communication query modes, and
the MIX_AIC latency envelope of ``latency_policy``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import yaml

LATENCY_COLUMNS = ("Average Duration(us)", "Profiling Average Duration(us)", "Duration(us)")
PROFILING_AVERAGE = "Profiling Average Duration(us)"

# torch dtype of a model tensor -> the profiler spelling the reader compares with
DTYPE_MAP: dict[torch.dtype, str] = {
    torch.bfloat16: "DT_BF16",
    torch.float16: "DT_BF16",  # the reader treats FP16 as BF16
    torch.int8: "INT8",
    torch.int32: "INT32",
    torch.int64: "INT64",
    torch.float32: "FLOAT",
    torch.bool: "BOOL",
}
# a profiler spelling -> a model dtype the reader maps to it (the spellings a query can reach)
QUERY_DTYPES: dict[str, torch.dtype] = {
    "DT_BF16": torch.bfloat16,
    "INT8": torch.int8,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FLOAT": torch.float32,
    "BOOL": torch.bool,
}

MATMUL_KERNELS = frozenset(
    {"MatMulV2", "MatMulV3", "MatMulCommon", "MatMul", "QuantBatchMatmulV3", "BatchMatMulV2", "TransposeBatchMatMul"}
)
FLATTEN_BATCH_KERNELS = frozenset(
    {"AscendQuantV2", "DynamicQuant", "RmsNorm", "AddRmsNormBias", "AddRmsNorm", "DispatchFFNCombine"}
)
BLOCK_SIZES = (16, 32, 64)
BLOCK_SIZE_MIN_DIM = {8: 64}

Shape = tuple[int, ...]
Query = list[tuple[Shape, torch.dtype]]


def first_latency(row: pd.Series, preferred: str) -> tuple[str, float] | None:
    """The reader's per-row fallback (``_row_latency_value``, a1c842e): the first finite positive
    value among the latency columns, the file's preferred one first; (column, value)."""
    for column in (preferred, *(c for c in LATENCY_COLUMNS if c != preferred)):
        if column not in row.index:
            continue
        try:
            value = float(row[column])
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and value > 0:
            return column, value
    return None


@dataclass(frozen=True)
class Generation:
    name: str
    per_row_fallback: bool  # skip to the next latency column where a row's cell is not positive
    select: str  # "first" | "nearest"


GENERATIONS = (
    Generation("8a2288d", per_row_fallback=False, select="first"),
    Generation("1293ea5", per_row_fallback=True, select="first"),
    Generation("a1c842e", per_row_fallback=True, select="nearest"),
)


@dataclass(frozen=True)
class Hit:
    kernel_type: str
    row: int  # position of the row in the file (0 = the first after the header)
    column: str
    latency_us: float


def parse_shapes(cell: Any) -> list[Shape]:
    text = str(cell).strip().strip('"')
    return [tuple(int(d) for d in part.split(",")) for part in (p.strip() for p in text.split(";")) if part]


def parse_list(cell: Any) -> list[str]:
    text = str(cell).strip().strip('"')
    return [item.strip() for item in text.split(";") if item.strip()]


def query_of(row: pd.Series) -> Query:
    """The tensor inputs a model operator passes to reach this row unchanged."""
    shapes = parse_shapes(row.get("Input Shapes", ""))
    dtypes = parse_list(row.get("Input Data Types", ""))
    unknown = [d for d in dtypes if d not in QUERY_DTYPES]
    if len(shapes) != len(dtypes) or unknown:
        raise LookupError(f"no model tensors reach this row: shapes {shapes}, dtypes {dtypes}")
    return [(shape, QUERY_DTYPES[dtype]) for shape, dtype in zip(shapes, dtypes)]


def _fractal_nz_to_nd(shape: Shape) -> Shape:
    if len(shape) < 4:
        return shape
    *batch, h, w, block_h, block_w = shape
    return (*batch, h * block_w, w * block_h)


def _strip_batch(shape: Shape) -> Shape:
    return shape[1:] if len(shape) > 1 and shape[0] == 1 else shape


def _is_block_padded(query_dim: int, csv_dim: int) -> bool:
    if query_dim <= csv_dim:
        return False
    if any(query_dim == -(-csv_dim // bs) * bs for bs in BLOCK_SIZES):
        return True
    return any(csv_dim >= low and query_dim == -(-csv_dim // bs) * bs for bs, low in BLOCK_SIZE_MIN_DIM.items())


def _padded(query: Shape, csv: Shape) -> bool:
    if len(query) != len(csv):
        return False
    pairs = [(q, c) for q, c in zip(query, csv) if q != c]
    return bool(pairs) and all(_is_block_padded(q, c) for q, c in pairs)


def _slot_rule(kernel_type: str, index: int, query: Shape, csv: Shape) -> str | None:
    """Which rule makes one input slot match, or None."""
    if query == csv:
        return "identity"
    stripped_query, stripped_csv = _strip_batch(query), _strip_batch(csv)
    if stripped_query in (stripped_csv, csv):
        return "batch_strip"
    if (kernel_type in MATMUL_KERNELS and index >= 1 and len(stripped_query) == 2 and len(csv) == 2
            and stripped_query == (csv[1], csv[0])):
        return "transpose"
    if _padded(stripped_query, csv) or _padded(stripped_query, stripped_csv):
        return "padding"
    if kernel_type in FLATTEN_BATCH_KERNELS and len(csv) == 2:
        three_d = stripped_query if len(stripped_query) == 3 else query if len(query) == 3 else None
        if three_d is not None:
            flat = (three_d[0] * three_d[1], three_d[2])
            if flat == csv:
                return "flatten_3d"
            if _padded(flat, csv):
                return "flatten_3d+padding"
    return None


def inputs_match(query: Query, row: pd.Series, kernel_type: str, input_count: int | None) -> str | None:
    """The rule by which the row matches the operator's inputs ("identity", ...), or None."""
    shapes = parse_shapes(row.get("Input Shapes", ""))
    dtypes = parse_list(row.get("Input Data Types", ""))
    formats = parse_list(row.get("Input Formats", ""))
    if input_count is not None:
        shapes, dtypes, formats = shapes[:input_count], dtypes[:input_count], formats[:input_count]
    if len(query) != len(shapes):
        return None
    rules = []
    for i, (shape, dtype) in enumerate(query):
        if i >= len(dtypes) or DTYPE_MAP.get(dtype) != dtypes[i]:
            return None
        csv_shape = _fractal_nz_to_nd(shapes[i]) if i < len(formats) and formats[i] == "FRACTAL_NZ" else shapes[i]
        rule = _slot_rule(kernel_type, i, shape, csv_shape)
        if rule is None:
            return None
        rules.append(rule)
    return next((r for r in rules if r != "identity"), "identity")


class AscendReader:
    """``ProfilingDataSource``'s compute lookup over one database directory, as one generation does it."""

    def __init__(self, data_dir: Path, generation: Generation) -> None:
        self.data_dir = data_dir
        self.generation = generation
        self.mapping: dict[str, Any] = yaml.safe_load((data_dir / "op_mapping.yaml").read_text(encoding="utf-8"))
        self._tables: dict[str, pd.DataFrame | None] = {}

    def table(self, kernel_type: str) -> pd.DataFrame | None:
        if kernel_type not in self._tables:
            path = self.data_dir / f"{kernel_type}.csv"
            self._tables[kernel_type] = pd.read_csv(path) if path.exists() else None
        return self._tables[kernel_type]

    def _row_latency(self, row: pd.Series, file_column: str) -> tuple[str, float] | None:
        if not self.generation.per_row_fallback:
            return file_column, float(row[file_column]) if file_column in row.index else math.nan
        return first_latency(row, file_column)

    def _latency_priority(self, kernel_type: str, column: str) -> int:
        overrides = (self.mapping.get("latency_policy") or {}).get("kernel_overrides", {})
        if overrides.get(kernel_type, {}).get("prefer_profiling_rows"):
            return 0 if column == PROFILING_AVERAGE else 1
        return LATENCY_COLUMNS.index(column)

    def lookup(self, func: str, query: Query) -> Hit | None:
        """The row (and value) the reader returns for this operator called with these inputs."""
        mapping = self.mapping["operator_mappings"][func]
        special = [key for key in ("composite", "category", "query_mode", "zero_cost", "accepted_miss") if mapping.get(key)]
        if special:
            raise NotImplementedError(f"{func}: only the compute path is re-implemented ({special})")
        kernel_types = list(dict.fromkeys([mapping["kernel_type"], *(mapping.get("alternate_kernel_types") or [])]))
        input_count = mapping.get("tc_input_count")
        if input_count is not None:
            query = query[:input_count]
        best: tuple[tuple[float, int, int], Hit] | None = None
        for kernel_index, kernel_type in enumerate(kernel_types):
            frame = self.table(kernel_type)
            if frame is None:
                continue
            file_column = next((c for c in LATENCY_COLUMNS if c in frame.columns), LATENCY_COLUMNS[-1])
            for position, (_, row) in enumerate(frame.iterrows()):
                latency = self._row_latency(row, file_column)
                if latency is None:
                    continue
                rule = inputs_match(query, row, kernel_type, input_count)
                if rule is None:
                    continue
                hit = Hit(kernel_type, position, *latency)
                if self.generation.select == "first":
                    return hit
                score = (1.0 if "padding" in rule else 0.0, kernel_index, self._latency_priority(kernel_type, latency[0]))
                if best is None or score < best[0]:
                    best = (score, hit)
        return None if best is None else best[1]
