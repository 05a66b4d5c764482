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

Counting distinct names between two positions of a long kernel sequence is a range query: a name
counts when its latest launch lies inside the range, so a Fenwick tree over launch positions,
holding a 1 at each name's latest launch, answers it in logarithmic time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perf_plugin.database.schema import CODE_REUSE_CAP


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
