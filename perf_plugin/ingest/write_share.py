"""How much of the traffic just before a traced operator was writes: the dirty share of the cache
it started with.

A line a kernel writes stays dirty in the last-level cache until it is evicted, and evicting it
costs a write to memory.  A kernel that streams more than the cache holds (a prefill GEMM's
weight) evicts the lines the kernels before it left: clean ones for free, dirty ones at the cost
of a write-back competing with its own reads.  In a model, a prefill GEMM follows element-wise
kernels that write megabytes (a norm in float32 over 512x4096 writes ~30 MB), a decode GEMV
follows kernels that write kilobytes after a GEMV that read its weights.  On an H100 the Llama
prefill GEMM of 512x4096x4096 took 26.7 us in the model, 23.7 us with an eviction by reads (clean
lines) inserted just before it in the model, and 27.2 us with an eviction by writes; timed alone
after an eviction by reads, 23.4 us, and with 24 MB or more written after it, 26.6 us
(``reproduce/wip/dirty_l2_effect.py``).

Per call (in device order): over the last ``WRITE_WINDOW_BYTES`` of traffic before it (every
earlier operator's inputs and outputs, as ``input_reuse`` counts them, the oldest operator in
the window in proportion), the share that was outputs; NaN for the first call.  Near the start
of the profile, where less traffic came before, what ran before the profile counts as reads: the
first kernels of a prefill follow a few kilobytes of writes, not a cache full of them (counted
as a share of the traffic seen, the embedding lookup replayed at 1.27-1.32x its in-model time).  A row's
``Profiling Average Recent Write Share`` is its calls' mean; the replay writes that share of its
device's last-level cache before every repeat (``perf_plugin.replay.dirty_lines``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from perf_plugin.ingest.input_reuse import read_bytes, slot_bytes
from perf_plugin.trace.mapped import MappedOp

# The traffic a share is taken over: about the last-level cache of the GPUs it was measured on
# (H100 50 MB, H200 60 MB), so that the share is of what the cache held; a replay on a device
# with another cache size scales the share to its own.
WRITE_WINDOW_BYTES = 64 * 2**20


def recent_write_shares(ops: Sequence[MappedOp], window: float | None = None) -> list[float]:
    """Per operator (in device order), the share of the last ``window`` bytes of traffic before
    it (``WRITE_WINDOW_BYTES`` by default) that were its predecessors' outputs (NaN where nothing
    moved before it)."""
    window = WRITE_WINDOW_BYTES if window is None else window
    recent: deque[tuple[float, float]] = deque()  # (traffic, written) per operator, oldest first
    traffic = written = 0.0
    shares: list[float] = []
    for op in ops:
        shares.append(_share(recent, traffic, written, window))
        out = float(sum(slot_bytes(slot) for slot in op.outputs))
        moved = float(read_bytes(op)) + out
        recent.append((moved, out))
        traffic, written = traffic + moved, written + out
        # the oldest operator leaves once the window holds enough traffic without it
        while len(recent) > 1 and traffic - recent[0][0] >= window:
            old_traffic, old_written = recent.popleft()
            traffic, written = traffic - old_traffic, written - old_written
    return shares


def _share(recent: deque[tuple[float, float]], traffic: float, written: float, window: float) -> float:
    if traffic <= 0:
        return math.nan
    if traffic <= window:
        return written / window  # the traffic before the profile read
    old_traffic, old_written = recent[0]
    kept = 1.0 - (traffic - window) / old_traffic  # of the oldest operator, the part inside the window
    return (written - old_written * (1.0 - kept)) / window
