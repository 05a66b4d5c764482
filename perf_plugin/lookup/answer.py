"""What a lookup asks and what it answers.

A ``Query`` names a kernel type and its inputs as a database row writes them (shapes, dtypes, and
optionally formats and outputs).  An ``Answer`` gives a duration in microseconds with its
provenance: ``exact`` (a row with these inputs), ``interpolated`` (from which rows, by which
method), or ``none`` (no row answers: the reason says why, e.g. outside the measured hull); it
never extrapolates silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perf_plugin.database.shapes import Shape

EXACT = "exact"
INTERPOLATED = "interpolated"
NONE = "none"


@dataclass(frozen=True)
class Query:
    kernel_type: str
    input_shapes: tuple[Shape | None, ...]
    input_dtypes: tuple[str, ...]  # normalised (DT_BF16 -> BF16)
    input_formats: tuple[str, ...] = ()  # empty: any
    output_shapes: tuple[Shape | None, ...] = ()  # empty: any


@dataclass(frozen=True)
class Answer:
    query: Query
    provenance: str  # exact | interpolated | none
    duration_us: float | None = None
    rows: tuple[int, ...] = ()  # the CSV lines (the header is line 1) the answer comes from
    column: str = ""  # the duration column read (exact), or the method (interpolated)
    reason: str = ""  # why there is no answer, or how the interpolation went
    details: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        if self.duration_us is None:
            return f"{self.query.kernel_type}: no answer ({self.reason})"
        where = ", ".join(f"row {r}" for r in self.rows)
        return f"{self.query.kernel_type}: {self.duration_us:.3f} us ({self.provenance}: {where}; {self.column})"
