"""The duration-gap CSV: microbench vs profiled duration of every row a run wrote back.

``reports/duration_gap_<timestamp>.csv``, one line per row, in write-back order::

    file,line,signature,microbench_us,profiling_us,ratio,flagged,kernels_differ,kernel_difference

``ratio`` is microbench / profiling, written to 4 decimals; durations are written to 3
decimals (nanoseconds).  ``flagged`` is ``true`` when the written ratio lies outside the closed
band [0.8, 1.2] (0.8 and 1.2 themselves are inside) and ``false`` otherwise, including rows that
have no ratio (no profiled duration): those have empty ``profiling_us`` and ``ratio`` cells.

``kernels_differ`` is ``true`` when the replay launched other device kernels than the profile
recorded for the row (``Profiling Kernels`` vs ``MicroBench Kernels``, both on one kind of
device; see ``perf_plugin.database.kernel_breakdown``), ``false`` when the same, and empty when
there is nothing to compare; ``kernel_difference`` names the kernels only one side launched.

The flag is decided on the ratio as written, not on the raw quotient: 287.208 / 239.34 is
1.2000000000000002 in binary floating point, and a row that reads ``1.2`` must not be flagged.
Every report (gap CSV, markdown, JSON, plot) flags through ``is_flagged``.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from perf_plugin.database.atomic import atomic_write_text
from perf_plugin.database.schema import format_number
from perf_plugin.results import GapRow

GAP_COLUMNS: tuple[str, ...] = (
    "file", "line", "signature", "microbench_us", "profiling_us", "ratio", "flagged",
    "kernels_differ", "kernel_difference",
)  # fmt: skip
GAP_BAND: tuple[float, float] = (0.8, 1.2)
DURATION_DIGITS = 3
RATIO_DIGITS = 4


def _number(value: float | None, digits: int) -> str:
    return "" if value is None else format_number(value, digits)


def rounded_ratio(gap: GapRow) -> float | None:
    ratio = gap.ratio
    return None if ratio is None else round(ratio, RATIO_DIGITS)


def is_flagged(gap: GapRow) -> bool:
    ratio = rounded_ratio(gap)
    return ratio is not None and not (GAP_BAND[0] <= ratio <= GAP_BAND[1])


def gap_cells(gap: GapRow) -> list[str]:
    return [
        gap.csv_file,
        "" if gap.row_line is None else str(gap.row_line),
        gap.signature_key,
        _number(gap.microbench_us, DURATION_DIGITS),
        _number(gap.profiling_us, DURATION_DIGITS),
        _number(gap.ratio, RATIO_DIGITS),
        "true" if is_flagged(gap) else "false",
        *_kernel_cells(gap),
    ]


def _kernel_cells(gap: GapRow) -> tuple[str, str]:
    if not (gap.profiled_kernels and gap.replayed_kernels):
        return "", ""
    difference = gap.kernel_difference
    return ("false", "") if difference is None else ("true", difference.describe())


def kernel_mismatches(gaps: Iterable[GapRow]) -> list[GapRow]:
    """Rows whose replay launched other kernels than their profile recorded, in write-back order."""
    return [gap for gap in gaps if gap.kernel_difference is not None]


def render_gap_csv(gaps: Iterable[GapRow]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(GAP_COLUMNS)
    for gap in gaps:
        writer.writerow(gap_cells(gap))
    return buffer.getvalue()


def write_gap_csv(path: str | Path, gaps: Iterable[GapRow]) -> Path:
    target = Path(path)
    atomic_write_text(target, render_gap_csv(gaps))
    return target


def gap_distance(gap: GapRow) -> float:
    """How far a row is from agreement, symmetric in over- and under-estimation (|log ratio|)."""
    ratio = gap.ratio
    return abs(math.log(ratio)) if ratio is not None and ratio > 0 else 0.0


def top_outliers(gaps: Sequence[GapRow], limit: int) -> list[GapRow]:
    """Flagged rows, furthest from agreement first (file order breaks ties)."""
    flagged = [g for g in gaps if is_flagged(g)]
    return sorted(flagged, key=gap_distance, reverse=True)[:limit]
