"""What a lookup asks and what it answers.

A ``Query`` names a kernel type and its inputs as a database row writes them (shapes, dtypes, and
optionally formats and outputs, and the data values rows carry such as a grouped GEMM's rows per
expert); a ``CollectiveQuery`` names a collective by operation, message size, rank count and
topology tier.  An ``Answer`` gives a duration in microseconds with its provenance: ``exact`` (a
row with these inputs), ``interpolated`` (from which rows, by which method), ``roofline`` (the
device's measured peaks, no row near enough), ``fallback`` (a model fitted to rows that do not
surround the query, the reason saying so), or ``none`` (no answer: the reason says why, e.g.
outside the measured hull); it never extrapolates silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perf_plugin.database.shapes import Shape

EXACT = "exact"
INTERPOLATED = "interpolated"
ROOFLINE = "roofline"
FALLBACK = "fallback"
NONE = "none"


@dataclass(frozen=True)
class Query:
    kernel_type: str
    input_shapes: tuple[Shape | None, ...]
    input_dtypes: tuple[str, ...]  # normalised (DT_BF16 -> BF16)
    input_formats: tuple[str, ...] = ()  # empty: any
    output_shapes: tuple[Shape | None, ...] = ()  # empty: any
    output_dtypes: tuple[str, ...] = ()  # empty: unknown (a GEMM's output then takes its input's dtype)
    input_values: str = ""  # the ``Input Values`` cell (a grouped GEMM's rows per expert); empty: any
    # other cells that say what the kernel does beyond its shapes (an attention row's
    # ``avg_seq_len`` and ``Runtime ...`` lengths and layout), as (column, cell) pairs
    attributes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CollectiveQuery:
    op: str  # allreduce, allgather, reducescatter, alltoall, ... as the collective CSVs name it
    message_bytes: int
    devices: int
    tier: str = ""  # topology tier as the CSVs write it; empty: any
    dtype: str = ""  # empty: any


@dataclass(frozen=True)
class Answer:
    query: Query | CollectiveQuery
    provenance: str  # exact | interpolated | roofline | fallback | none
    duration_us: float | None = None
    rows: tuple[int, ...] = ()  # the CSV lines (the header is line 1) the answer comes from
    column: str = ""  # the duration column read (exact), or the method (interpolated)
    reason: str = ""  # why there is no answer, or how the interpolation went
    details: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        if self.duration_us is None:
            return f"{self.subject}: no answer ({self.reason})"
        where = ", ".join(f"row {r}" for r in self.rows) or "no row"
        note = f"; {self.reason}" if self.reason else ""
        return f"{self.subject}: {self.duration_us:.3f} us ({self.provenance}: {where}; {self.column}{note})"

    @property
    def subject(self) -> str:
        query = self.query
        if isinstance(query, CollectiveQuery):
            return f"{query.op} of {query.message_bytes} B over {query.devices} devices"
        return query.kernel_type
