"""The ``Profiling Input Quantiles`` cell: per input slot, quantiles of the values the input held
in the profiled model, where an input-value capture recorded them (``perf_plugin.capture``).

A slot's quantiles are numbers separated by ``,``, the least first (every sixteenth of the sorted
values, both ends included); slots are separated by ``;`` as in ``Input Shapes``, an empty slot
had none recorded; ``-inf`` and ``inf`` are values (top-k over scores masked to ``-inf``).  A
row's cell holds, per slot and quantile, the lower median over the calls that recorded it: the
calls a row aggregates share shapes, not values, and the median keeps a typical call's spread.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.slot_records import records_by_slot

QUANTILE_DIGITS = 7


def quantiles_cell(samples: Sequence[Mapping[int, tuple[float, ...]]]) -> str:
    """A row's cell from its calls' quantiles (argument position -> quantiles; {} where a call
    recorded none): per slot, each quantile's median over the calls that recorded the slot."""
    cells = []
    for recorded in records_by_slot(samples):
        if not recorded or len({len(q) for q in recorded}) != 1:
            cells.append("")
            continue
        # median_low: a value some call had (no mean of -inf and a number, a model's masked scores)
        medians = [statistics.median_low(q[i] for q in recorded) for i in range(len(recorded[0]))]
        cells.append(",".join(f"{value:.{QUANTILE_DIGITS}g}" for value in medians))
    return ";".join(cells) if any(cells) else ""


def parse_quantiles_cell(cell: str) -> tuple[tuple[float, ...] | None, ...]:
    """Per slot the quantiles (None for an empty slot); () for an empty cell.

    Raises DatabaseError naming the slot for text that is not numbers, NaN, fewer than two
    numbers, or numbers not in ascending order."""
    if not cell.strip():
        return ()
    slots: list[tuple[float, ...] | None] = []
    for slot, text in enumerate(cell.split(";")):
        if not text.strip():
            slots.append(None)
            continue
        try:
            values = tuple(float(token) for token in text.split(","))
        except ValueError:
            values = ()
        if len(values) < 2 or any(math.isnan(v) for v in values) or list(values) != sorted(values):
            raise DatabaseError(f"slot {slot}: {text.strip()!r} is not two or more numbers in ascending order")
        slots.append(values)
    return tuple(slots)
