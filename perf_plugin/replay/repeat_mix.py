"""Steps before a replay's repeats taken in proportion: a row whose calls met the device in
several states (``perf_plugin.replay.cold_inputs.call_states``) replays each on its share of the
repeats, so that the mean over the repeats is the mean over the model's calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Step = Callable[[], Any] | None


def in_proportion(steps: Sequence[tuple[Step, float]]) -> Step:
    """A no-argument call that runs each step on its weight's share of the calls, interleaved so
    that every run of calls is as near those shares as whole calls allow (smooth weighted
    round-robin: weights 3 and 1 run the first, first, second, first, ...; a None is no step).
    One step is returned as it is."""
    if not steps:
        raise ValueError("no steps to take in proportion")
    if len(steps) == 1:
        return steps[0][0]
    if any(not weight > 0 for _, weight in steps):
        raise ValueError(f"weights must be positive: {[weight for _, weight in steps]}")
    total = sum(weight for _, weight in steps)
    credit = [0.0] * len(steps)

    def run() -> None:
        for index, (_, weight) in enumerate(steps):
            credit[index] += weight
        chosen = max(range(len(steps)), key=credit.__getitem__)
        credit[chosen] -= total
        step = steps[chosen][0]
        if step is not None:
            step()

    return run
