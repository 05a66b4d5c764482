"""``lookup``: a query against one database directory.

Exact first: a row whose input shapes and dtypes (and formats and output shapes, where the query
gives them) are the query's answers with its duration (``rows.py`` says which column).  Else, for
the GEMM kernel types, an interpolation along one dimension (``gemm.py``); for the kernel types
that stream their inputs (element-wise, norms, casts, copies: ``BY_SIZE_TYPES``), an
interpolation in input bytes (``by_size.py``).  Else no answer, with the reason.
"""

from __future__ import annotations

from pathlib import Path

from perf_plugin.database.errors import DatabaseError
from perf_plugin.lookup import by_size, gemm
from perf_plugin.lookup.answer import EXACT, NONE, Answer, Query
from perf_plugin.lookup.rows import MeasuredRow, read_rows

GEMM_TYPES = frozenset({"MatMulV2", "MatMulV3", "MatMulCommon", "MatMul"})
# Kernels whose time follows the bytes they read: element-wise, norms, casts and copies.
BY_SIZE_TYPES = frozenset({
    "Add", "AddAiCore", "Sub", "Mul", "MulAiCore", "Muls", "RealDiv", "Div", "Neg", "Exp", "Sqrt", "Rsqrt", "Pows",
    "Cast", "CastAiCore", "TensorMove", "TensorMoveAiCore", "TransData", "Relu", "ReluGrad", "Sigmoid", "Sin", "Cos",
    "Abs", "SwiGlu", "RmsNorm", "AddRmsNorm", "LayerNorm", "SoftmaxV2", "ZerosLike", "OnesLike", "Fill",
})


def _present(shapes: tuple[object, ...], values: tuple[str, ...]) -> tuple[tuple[object, str], ...]:
    return tuple((s, values[i] if i < len(values) else "") for i, s in enumerate(shapes) if s is not None)


def matches(row: MeasuredRow, query: Query) -> bool:
    if _present(row.input_shapes, row.input_dtypes) != _present(query.input_shapes, query.input_dtypes):
        return False
    if query.input_formats:
        formats = {"", "ND"}
        mine = [f if f not in formats else "ND" for _, f in _present(row.input_shapes, row.input_formats)]
        theirs = [f if f not in formats else "ND" for _, f in _present(query.input_shapes, query.input_formats)]
        if mine != theirs:
            return False
    if query.output_shapes:
        return [s for s in row.output_shapes if s is not None] == [s for s in query.output_shapes if s is not None]
    return True


def lookup(database: str | Path, query: Query) -> Answer:
    """The duration of ``query`` from the database directory ``database``."""
    path = Path(database) / f"{query.kernel_type}.csv"
    if not path.is_file():
        raise DatabaseError(f"no CSV of kernel type {query.kernel_type}", path=path)
    rows = read_rows(path)
    exact = [row for row in rows if matches(row, query)]
    timed = [row for row in exact if row.duration_us is not None]
    if timed:
        row = timed[0]  # the first, as the Ascend reader takes it
        return Answer(query, EXACT, row.duration_us, (row.line,), row.column)
    method = gemm.interpolate if query.kernel_type in GEMM_TYPES else \
        by_size.interpolate if query.kernel_type in BY_SIZE_TYPES else None
    if method is not None:
        answer = method(query, rows)
        if exact and answer.duration_us is None:
            return Answer(query, NONE, reason=f"row {exact[0].line} has these inputs but no duration; {answer.reason}")
        return answer
    if exact:
        return Answer(query, NONE, reason=f"row {exact[0].line} has these inputs but no duration")
    return Answer(query, NONE, reason=f"no row of {path.name} has these inputs, and {query.kernel_type} has no "
                                      "interpolation (GEMMs, and kernels that stream their inputs)")
