"""``lookup``: a query against one database directory.

Exact first: a row whose input shapes and dtypes (and formats, output shapes and input values,
where the query gives them) are the query's answers with its duration (``rows.py`` says which
column).  Else the kernel family's interpolation inside the hull of measured rows: GEMMs in
(M, N, K) (``gemm.py``); attention by batch, lengths and KV spread (``attention.py``); grouped MoE
GEMMs by rows and the split's load spread (``grouped.py``); packed (TND) flash attention by batch,
request length and length spread (``varlen_attention.py``); kernels that stream their inputs by
bytes, or rows and width (``by_size.py``).  Outside the hull of the family's rows, the nearest
row's efficiency held (a ``fallback``, ``efficiency.py``).  With no row of the family at all and
the device's peaks beside the database (``perfdb peaks``), the roofline, saying why no row
answered.  Else no answer, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.database.errors import DatabaseError
from perf_plugin.lookup import attention, by_size, gemm, grouped, varlen_attention
from perf_plugin.lookup.answer import EXACT, NONE, ROOFLINE, Answer, Query
from perf_plugin.lookup.peaks import DevicePeaks, find_peaks
from perf_plugin.lookup.roofline import Work, describe_roofline, ideal_us, tensor_bytes
from perf_plugin.lookup.rows import MeasuredRow, read_rows

RUNTIME_PREFIX = "Runtime "  # the columns of an attention row's runtime lengths (``perfdb fia-runtime``)

GEMM_TYPES = frozenset({"MatMulV2", "MatMulV3", "MatMulCommon", "MatMul", "BatchMatMulV2", "BatchMatMul",
                        "aten.mm", "aten.bmm", "aten.addmm", "aten._scaled_mm"})
# Kernels whose time follows the bytes they read: element-wise, norms, casts and copies.
BY_SIZE_TYPES = frozenset({
    "Add", "AddAiCore", "Sub", "Mul", "MulAiCore", "Muls", "RealDiv", "Div", "Neg", "Exp", "Sqrt", "Rsqrt", "Pows",
    "Cast", "CastAiCore", "TensorMove", "TensorMoveAiCore", "TransData", "Relu", "ReluGrad", "Sigmoid", "Sin", "Cos",
    "Abs", "SwiGlu", "RmsNorm", "AddRmsNorm", "LayerNorm", "SoftmaxV2", "ZerosLike", "OnesLike", "Fill",
})
Interpolation = Callable[[Query, Sequence[MeasuredRow], "DevicePeaks | None"], Answer]


def family(kernel_type: str) -> tuple[Interpolation, Callable[[Query], Work | None]] | None:
    """The interpolation and the work (for the roofline) of a kernel type; None: neither is known."""
    if kernel_type in GEMM_TYPES:
        return gemm.interpolate, gemm.query_work
    if kernel_type in attention.KERNEL_TYPES:
        return attention.interpolate, attention.query_work
    if kernel_type in grouped.KERNEL_TYPES:
        return grouped.interpolate, grouped.query_work
    if kernel_type in varlen_attention.KERNEL_TYPES:
        return varlen_attention.interpolate, varlen_attention.query_work
    if kernel_type in BY_SIZE_TYPES:
        return by_size.interpolate, streaming_work
    return None


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
    values = row.cells.get("Input Values", "").strip().strip('"')
    if query.input_values and values != query.input_values:
        return False
    if values and not query.input_values and query.kernel_type in varlen_attention.KERNEL_TYPES:
        return False  # packed requests: a query without lengths asks for even ones, a row with them measured others
    for column, cell in query.attributes:  # an attention row's lengths: part of what it measured
        if column in row.cells and row.cells[column].strip().strip('"') != cell.strip().strip('"'):
            return False
    # a row measured at lengths of its own answers only a query that gives them: a query without
    # them asks for the even lengths its shapes say (a prefill of 4 x 8192 tokens took 17.5 ms at
    # even lengths, 64.5 ms at one request of 32765 and three of 1, with the same shapes)
    given = {column for column, _ in query.attributes}
    if any(column.startswith(RUNTIME_PREFIX) and cell.strip() and column not in given
           for column, cell in row.cells.items()):
        return False
    if query.output_shapes:
        return [s for s in row.output_shapes if s is not None] == [s for s in query.output_shapes if s is not None]
    return True


def streaming_work(query: Query) -> Work | None:
    """A kernel that reads its inputs once and writes an output as large as the largest."""
    return by_size.streaming_work(query.input_shapes, query.input_dtypes)


@dataclass(frozen=True)
class ExactStep:
    path: Path  # the kernel type's CSV
    rows: Sequence[MeasuredRow]
    exact: list[MeasuredRow]  # rows with the query's inputs, with or without a duration
    answer: Answer | None  # the first of them with a duration, as the Ascend reader takes it


def exact_step(database: str | Path, query: Query) -> ExactStep:
    """The rows of the query's kernel type and its exact answer, if a row gives one (the first
    step of every lookup, this project's and the policy's)."""
    path = Path(database) / f"{query.kernel_type}.csv"
    if not path.is_file():
        raise DatabaseError(f"no CSV of kernel type {query.kernel_type}", path=path)
    rows = read_rows(path)
    exact = [row for row in rows if matches(row, query)]
    row = next((row for row in exact if row.duration_us is not None), None)
    answer = None if row is None else Answer(query, EXACT, row.duration_us, (row.line,), row.column)
    return ExactStep(path, rows, exact, answer)


def lookup(database: str | Path, query: Query) -> Answer:
    """The duration of ``query`` from the database directory ``database``."""
    step = exact_step(database, query)
    if step.answer is not None:
        return step.answer
    path, rows, exact = step.path, step.rows, step.exact
    peaks = find_peaks(Path(database))
    methods = family(query.kernel_type)
    if methods is None:
        reason = f"no row of {path.name} has these inputs, and {query.kernel_type} has no interpolation"
        return roofline_answer(query, streaming_work(query), peaks, _untimed(exact, reason), memory_only=True)
    answer = methods[0](query, rows, peaks)
    if answer.duration_us is not None:
        return answer
    return roofline_answer(query, methods[1](query), peaks, _untimed(exact, answer.reason))


def _untimed(exact: list[MeasuredRow], reason: str) -> str:
    return f"row {exact[0].line} has these inputs but no duration; {reason}" if exact else reason


def roofline_answer(query: Query, work: Work | None, peaks: DevicePeaks | None, why: str,
                    memory_only: bool = False) -> Answer:
    """The roofline estimate, the reason naming why no row answered; no answer without peaks."""
    if peaks is None or work is None:
        return Answer(query, NONE, reason=why)
    ideal = ideal_us(work, peaks)
    if ideal is None:
        return Answer(query, NONE, reason=f"{why}; {describe_roofline(work, peaks)}")
    note = " (bytes only: its operations are not modelled)" if memory_only else ""
    return Answer(query, ROOFLINE, ideal[0], (), f"{describe_roofline(work, peaks)}{note}", reason=why,
                  details={"roofline_us": ideal[0]})
