"""The ``Profiling Input Reuse Distance(B)`` cell: per input slot, how many bytes the device moved
between the write of the input and the row's kernel reading it in the profiled model
(``perf_plugin.ingest.input_reuse`` computes it from a trace; a replay compares it with its
device's cache size).  Slots are separated by ``;`` as in ``Input Shapes``; ``-`` marks an input
no earlier kernel of the trace wrote (a parameter, data from before the profile).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from perf_plugin.database.errors import DatabaseError

NO_PRODUCER = "-"


def reuse_cell(samples: Sequence[tuple[float, ...]]) -> str:
    """A row's cell from its calls' distances: per slot the median (``-`` where it is no producer)."""
    if not samples:
        return ""
    slots = max(len(sample) for sample in samples)
    cells = []
    for j in range(slots):
        values = [sample[j] if j < len(sample) else math.inf for sample in samples]
        median = statistics.median_low(sorted(values))
        cells.append(NO_PRODUCER if math.isinf(median) else str(int(round(median))))
    return ";".join(cells)


def parse_reuse_cell(cell: str) -> tuple[float, ...]:
    """The slots of a cell (``math.inf`` for ``-``); () for an empty cell (no evidence)."""
    if not cell.strip():
        return ()
    values = []
    for slot, token in enumerate(cell.split(";")):
        token = token.strip()
        if token in (NO_PRODUCER, ""):
            values.append(math.inf)
            continue
        try:
            value = float(token)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise DatabaseError(f"slot {slot}: {token!r} is neither a byte count nor {NO_PRODUCER!r}")
        values.append(value)
    return tuple(values)
