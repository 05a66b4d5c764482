"""How recently the device ran an operator's kernels: its code reuse distance, in distinct kernels.

A kernel's code is fetched into the compute units' instruction caches when it runs and stays
there until enough other code has run.  In an eager model most kernels find their code evicted
(some hundred distinct kernels run between two calls of one kernel), but not all: rotary
embedding runs its ``mul``, ``neg`` and ``cat`` kernels for the queries and then, a few kernels
later, for the keys, which find the same code still cached.  A replay evicts the instruction
caches before every repeat unless the row says the model found its code there
(``perf_plugin.replay.code_eviction``), and this is what says it.

Per launch of an operator (in device order): the number of distinct kernel names the device ran
between the previous launch of each of its kernels and this one, the largest over its kernels,
at most ``CODE_REUSE_CAP``; not a number where one of its kernels had not run before in the
profile (what ran before the profile is unknown).  A row's ``Profiling Average Code Reuse
Distance(kernels)`` is the mean over its calls that have one, so a kernel's first launch in the
profile does not weigh on the row.

Where the instruction caches lost a kernel's code, the last-level cache may still hold it: code
is fetched through it like data, and stays there until the kernels in between have moved about
as many bytes as it holds.  On an H100 the FP8 model's per-token division (``RealDiv`` of a
``[1,4096]`` bf16 by a 0-d float32) took 3.42-3.58 us in the model where under 17 MB had moved
since its previous call and 3.94-4.16 us after a 58 MB weight had streamed through; a replay that
evicts only the instruction caches, 3.68-3.71 us, and every cache, 4.40-4.45 us
(``reproduce/wip/code_l2_effect.py``).  Per call, ``code_reuse_bytes`` gives the bytes moved
since the previous call of its kernels began (the inputs and outputs of that call and of those in
between, as ``input_reuse`` counts them); a row's ``Profiling Code Reuse Distance(B)`` is their
median, ``-`` where most calls had no earlier one in the profile.

Counting distinct names between two positions of a long kernel sequence is a range query: a name
counts when its latest launch lies inside the range, so a Fenwick tree over launch positions,
holding a 1 at each name's latest launch, answers it in logarithmic time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perf_plugin.database.schema import CODE_REUSE_CAP
from perf_plugin.ingest.input_reuse import read_bytes, slot_bytes
from perf_plugin.trace.mapped import MappedOp


class _LatestLaunches:
    """A 1 at each kernel name's latest launch position; counts of them over position ranges."""

    def __init__(self, size: int) -> None:
        self.tree = [0] * (size + 1)
        self.latest: dict[str, int] = {}

    def _add(self, position: int, delta: int) -> None:
        index = position + 1
        while index < len(self.tree):
            self.tree[index] += delta
            index += index & -index

    def _prefix(self, position: int) -> int:
        """The count at positions below ``position``."""
        total, index = 0, position
        while index > 0:
            total += self.tree[index]
            index -= index & -index
        return total

    def distinct_since(self, name: str, now: int) -> float:
        """Distinct names launched after ``name``'s latest launch and before ``now`` (NaN: none)."""
        previous = self.latest.get(name)
        if previous is None:
            return math.nan
        return float(min(CODE_REUSE_CAP, self._prefix(now) - self._prefix(previous + 1)))

    def launch(self, name: str, position: int) -> None:
        previous = self.latest.get(name)
        if previous is not None:
            self._add(previous, -1)
        self._add(position, 1)
        self.latest[name] = position


def code_reuse_distances(kernels_per_call: Sequence[Sequence[str]]) -> list[float]:
    """Per call (in device order, each the names of the kernels it launched, in order), the
    distinct kernels run since its kernels last ran (``CODE_REUSE_CAP`` at most; NaN for a call
    with a kernel not run before, or with none)."""
    latest = _LatestLaunches(sum(len(kernels) for kernels in kernels_per_call))
    position = 0
    distances: list[float] = []
    for kernels in kernels_per_call:
        distance = math.nan if not kernels else 0.0
        for name in kernels:
            # a kernel without history leaves the call without one (max() would drop a NaN)
            since = latest.distinct_since(name, position)
            distance = math.nan if math.isnan(since) or math.isnan(distance) else max(distance, since)
            latest.launch(name, position)
            position += 1
        distances.append(distance)
    return distances


def code_reuse_bytes(kernels_per_call: Sequence[Sequence[str]], ops: Sequence[MappedOp]) -> list[float]:
    """Per call (in device order: the names of the kernels it launched, and its operator), the
    bytes moved since its kernels' previous call began, the most over its kernels (``math.inf``
    for a call with a kernel not run before, or with none).  The previous call's own traffic
    counts: its code was fetched as it began, and a GEMV's weight streaming through the cache
    after that evicts the code as surely as another kernel's would."""
    moved = 0.0
    moved_at_start: dict[str, float] = {}  # per kernel name, the bytes moved before its latest call
    distances: list[float] = []
    for kernels, op in zip(kernels_per_call, ops, strict=True):
        since = [moved - moved_at_start[name] if name in moved_at_start else math.inf for name in kernels]
        distances.append(max(since, default=math.inf))
        moved_at_start.update(dict.fromkeys(kernels, moved))
        moved += read_bytes(op) + sum(slot_bytes(slot) for slot in op.outputs)
    return distances
