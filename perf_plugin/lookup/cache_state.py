"""Whether the replay found a streaming kernel's inputs in the cache, read from a measured row.

On a backend whose ``auto`` mode rotates copies of the inputs (CUDA), a row nobody profiled is
timed in ``rotate`` (``perf_plugin.replay.cache_modes``): its cycle of at most
``MAX_ROTATION_COPIES`` copies keeps inputs smaller than twice the cache over that cap in the
cache, and reads larger ones from memory.  A norm or an element-wise kernel of a few rows takes
far longer read from memory (an H100's layer norm of 8 rows of 4096: 4.1 us cached, 7.3 us at 12
rows from memory), so the rows on either side of that size are two curves, not one: a lookup
interpolates a query only among rows in its own state, as the replay would time it.  Without the
device's cache size (a peaks file written before ``perfdb peaks`` recorded it), or for rows whose
replay was another mode (a profiled row, another backend), every row is one curve, as before.
"""

from __future__ import annotations

from collections.abc import Callable

from perf_plugin.backends.select import BACKEND_CLASSES
from perf_plugin.database.schema import MICROBENCH_BACKEND, PROFILING_AVERAGE
from perf_plugin.lookup.rows import MeasuredRow
from perf_plugin.replay.cache_modes import rotation_keeps_inputs_cached


def rotated(row: MeasuredRow) -> bool:
    """Whether ``auto`` timed the row in ``rotate``: replayed by a backend whose ``auto`` rotates,
    and never profiled (a profiled row's inputs are placed as its profile says)."""
    backend = BACKEND_CLASSES.get(row.cells.get(MICROBENCH_BACKEND, ""))
    return backend is not None and backend.auto_cache_mode == "rotate" and not row.cells.get(PROFILING_AVERAGE, "")


def same_state(rows: list[MeasuredRow], query_bytes: float, cache_bytes: int | None,
               input_bytes: Callable[[MeasuredRow], float]) -> list[MeasuredRow]:
    """``rows`` in the query's cache state (``input_bytes`` gives a row's inputs' bytes), where
    every one was timed in ``rotate`` and the device's cache size is known; else ``rows`` unchanged."""
    if not cache_bytes or not rows or not all(rotated(row) for row in rows):
        return rows
    wanted = rotation_keeps_inputs_cached(int(query_bytes), cache_bytes)
    return [row for row in rows if rotation_keeps_inputs_cached(int(input_bytes(row)), cache_bytes) == wanted]
