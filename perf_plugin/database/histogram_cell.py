"""A histogram in one cell: ``value:count`` pairs separated by ``,``, smallest value first
(``1:8,2:16,25:8``), each value once, values non-negative and counts positive.

The selection depths of a top-k's rows (``perf_plugin.database.depths_cell``, one histogram per
input slot) and the code reuse distances of a row's calls
(``Profiling Code Reuse Distances(kernels)``) are cells of this form.
"""

from __future__ import annotations

from collections.abc import Mapping

from perf_plugin.database.errors import DatabaseError


def histogram_text(counts: Mapping[int, int]) -> str:
    """The cell of ``counts`` (value -> count); values of no count are left out."""
    return ",".join(f"{value}:{count}" for value, count in sorted(counts.items()) if count > 0)


def parse_histogram(text: str, value_name: str = "value", count_name: str = "count") -> dict[int, int]:
    """The histogram of a cell's text ({} for an empty one).

    Raises DatabaseError (without a location: the caller names its column or slot) for text that
    is not ``value:count`` pairs of non-negative values and positive counts, each value once."""
    if not text.strip():
        return {}
    try:
        pairs = [tuple(int(part) for part in pair.split(":")) for pair in text.split(",")]
    except ValueError:
        pairs = []
    histogram = {pair[0]: pair[1] for pair in pairs if len(pair) == 2}
    if not pairs or len(histogram) != len(pairs) or any(value < 0 or count < 1 for value, count in histogram.items()):
        raise DatabaseError(
            f"{text.strip()!r} is not {value_name}:{count_name} pairs (each {value_name} once, {count_name} > 0)"
        )
    return histogram
