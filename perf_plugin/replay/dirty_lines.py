"""Dirty lines in the last-level cache before a repeat, as many as the profiled model left.

The ``produced`` cache mode evicts the cache by reading a buffer, which leaves it full of clean
lines, and then rewrites the inputs the model found cached.  A kernel that streams more data than
the cache holds then evicts clean lines for free.  In a model the kernels before it may have
left many lines dirty, whose eviction costs a write to memory: on an H100 the Llama prefill GEMM
of 512x4096x4096 ran 26.7 us in the model and 23.7 us with the cache evicted by reads just before
it (``reproduce/wip/dirty_l2_effect.py``).  A decode GEMV follows kernels that wrote kilobytes
and meets a clean cache, as the eviction by reads leaves it.

A row ingested from a trace with device activity has the share of the traffic before its calls
that was writes (``Profiling Average Recent Write Share``, ``perf_plugin.ingest.write_share``).
Before every repeat, after the eviction and before the inputs are rewritten, the replay writes
that share of its device's cache, less the bytes the rewrite of the inputs writes anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import PROFILING_COUNTER_PREFIX, RECENT_WRITE_SHARE
from perf_plugin.replay.tensors import KernelRow

WRITE_SHARE_COLUMN = PROFILING_COUNTER_PREFIX + RECENT_WRITE_SHARE


def dirty_bytes(row: KernelRow, cache_bytes: int, rewritten_bytes: int) -> int:
    """The bytes to leave dirty in a cache of ``cache_bytes`` besides the ``rewritten_bytes`` of
    inputs (0 where the row has no evidence).  Raises DatabaseError naming the column when the
    cell is not a share between 0 and 1."""
    cell = row.attrs.get(WRITE_SHARE_COLUMN, "").strip()
    if not cell:
        return 0
    try:
        share = float(cell)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise DatabaseError(f"{cell!r} is not a share between 0 and 1", column=WRITE_SHARE_COLUMN)
    return max(0, int(share * cache_bytes) - rewritten_bytes)


def dirty_lines(buffer: Any, nbytes: int) -> Callable[[], Any] | None:
    """A no-argument call writing the first ``nbytes`` of the byte tensor ``buffer`` (the whole
    of it at most; None for no bytes)."""
    if nbytes <= 0:
        return None
    lines = buffer[:nbytes]

    def write() -> Any:
        return lines.fill_(1)

    return write
