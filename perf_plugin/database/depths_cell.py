"""The ``Profiling Selection Depths`` cell: per input slot, how many rows of a top-k's input
selected their k-th value at each depth (``perf_plugin.capture.selection_depth``).

A slot's cell is ``depth:rows`` pairs separated by ``,``, shallowest first (``9:40,10:466,32:6``);
slots are separated by ``;`` as in ``Input Shapes``, an empty slot had none recorded.  A row's
cell sums its calls' counts: the calls a row aggregates share shapes, not values, and the pooled
rows keep how often each depth came, ties included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.slot_records import records_by_slot

Histogram = Mapping[int, int]


def depths_cell(samples: Sequence[Mapping[int, Histogram]]) -> str:
    """A row's cell from its calls' histograms (argument position -> depth -> rows; {} where a
    call recorded none): per slot, the counts summed over the calls that recorded the slot."""
    cells = []
    for recorded in records_by_slot(samples):
        pooled: Counter[int] = Counter()
        for histogram in recorded:
            pooled.update(histogram)
        cells.append(",".join(f"{depth}:{rows}" for depth, rows in sorted(pooled.items()) if rows > 0))
    return ";".join(cells) if any(cells) else ""


def parse_depths_cell(cell: str) -> tuple[dict[int, int] | None, ...]:
    """Per slot the histogram (None for an empty slot); () for an empty cell.

    Raises DatabaseError naming the slot for text that is not ``depth:rows`` pairs of
    non-negative depths and positive counts, each depth once."""
    if not cell.strip():
        return ()
    slots: list[dict[int, int] | None] = []
    for slot, text in enumerate(cell.split(";")):
        if not text.strip():
            slots.append(None)
            continue
        try:
            pairs = [tuple(int(part) for part in pair.split(":")) for pair in text.split(",")]
        except ValueError:
            pairs = []
        histogram = {pair[0]: pair[1] for pair in pairs if len(pair) == 2}
        if not pairs or len(histogram) != len(pairs) or any(d < 0 or n < 1 for d, n in histogram.items()):
            raise DatabaseError(f"slot {slot}: {text.strip()!r} is not depth:rows pairs (each depth once, rows > 0)")
        slots.append(histogram)
    return tuple(slots)
