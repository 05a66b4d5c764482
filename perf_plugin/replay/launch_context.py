"""Whether a replay's repeats reach an idle device, as the profiled model's launches of the row did.

An eager model's host launches each kernel of a decode step tens of microseconds after the one
before has finished (``Profiling Average Launched Idle``: the share of a row's launches that found
the device idle, ``perf_plugin.ingest.trace_attribution``).  ``produced`` launches the repeats of
a row launched idle on most of its calls only once the device has finished the step before (the
wait is on the host, outside the timed range).
"""

from __future__ import annotations

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import LAUNCHED_IDLE, PROFILING_COUNTER_PREFIX
from perf_plugin.replay.tensors import KernelRow

LAUNCHED_IDLE_COLUMN = PROFILING_COUNTER_PREFIX + LAUNCHED_IDLE


def launched_idle(row: KernelRow) -> bool:
    """Whether most of the row's profiled launches found the device idle (False without the cell).

    Raises DatabaseError naming the column when the cell is not a share."""
    cell = row.attrs.get(LAUNCHED_IDLE_COLUMN, "").strip()
    if not cell:
        return False
    try:
        share = float(cell)
    except ValueError:
        share = -1.0
    if not 0 <= share <= 1:
        raise DatabaseError(f"{cell!r} is not a share of launches (0 to 1)", column=LAUNCHED_IDLE_COLUMN)
    return share >= 0.5
