"""The step every kernel family shares: efficiency against the roofline, interpolated in the hull.

A row's efficiency is its roofline time (or, without device peaks, its work) over its measured
time.  Its logarithm is interpolated (``hull.py``), not the efficiency itself: where a kernel's
work and time are each a power of a dimension between two rows (a latency-bound kernel whose time
stays flat while its work doubles, a bandwidth-bound one whose time follows its bytes), the log of
their ratio is linear in the log of the dimension, so the interpolation is exact there, and the
roofline's kink between memory and compute bound comes from the query's own roofline time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perf_plugin.lookup import hull, learned, transfer
from perf_plugin.lookup.answer import FALLBACK, INTERPOLATED, NONE, Answer, Query
from perf_plugin.lookup.peaks import DevicePeaks


def point(position: tuple[float, ...], ideal: float, duration_us: float, line: int) -> hull.Point:
    return hull.Point(position, math.log(ideal / duration_us), (line,))


def one_length_axis(
    points: list[hull.Point], target: tuple[float, ...], axes: tuple[str, ...], name: str
) -> tuple[list[hull.Point], tuple[float, ...], tuple[str, ...]]:
    """Where the query and every point attend over their own tokens (axes 1 and 2, the query and
    KV lengths, equal: a prefill), one axis ``name`` for both, since a hull over the two would be
    flat; otherwise the arguments unchanged."""
    if target[1] != target[2] or any(p.raw[1] != p.raw[2] for p in points):
        return points, target, axes

    def merged(values: tuple[float, ...]) -> tuple[float, ...]:
        return (*values[:2], *values[3:])

    return [hull.Point(merged(p.raw), p.value, p.lines) for p in points], merged(target), (axes[0], name, *axes[3:])


def against(used: DevicePeaks | None) -> str:
    if used is None:
        return "work"
    return f"the roofline of {used.path.name if used.path is not None else 'the device peaks'}"


def answer(query: Query, points: Sequence[hull.Point], target: tuple[float, ...], axes: Sequence[str],
           ideal: float, label: str, used: DevicePeaks | None, too_few: str,
           details: dict[str, float] | None = None, narrowest: bool = False,
           carry: transfer.Similar | None = None, step: transfer.Similar | None = None,
           learn: Sequence[transfer.Similar] = ()) -> Answer:
    """The query's time from the ``points`` of its family: its ``ideal`` time over their
    interpolated efficiency (log axes), or no answer saying why (``too_few`` rows, outside the hull).
    With ``carry`` (which series are alike) an interpolation along one axis takes the
    deviation the family's other series show at the query's value (``transfer.py``); with ``step``
    (which series step alike) a query at the edge of its own series along the first axis is its
    nearest row there, stepped as those series step (``transfer.carry_step``); with ``learn`` (the
    notions of alike its features read) the interpolation along one axis takes the deviation a
    model learned from the family's rows gives (``learned.py``), where there are enough to learn."""
    if len(points) < 2:
        return Answer(query, NONE, reason=too_few)
    merged = hull.merge(points)
    found = hull.estimate(merged, target, axes, (math.log,) * len(axes), narrowest=narrowest)
    if isinstance(found, str):
        return _nearest_held(query, merged, target, axes, ideal, label, used, found)
    if step is not None and found.axes and found.axes != (axes[0],):
        # not bracketed along the first axis in its own series: its own rows, stepped as others step
        found = transfer.carry_step(merged, target, axes, step) or found
    corrected = learned.learned_deviation(merged, target, found, axes, learn) if learn else None
    if corrected is not None:
        found = corrected
    elif carry is not None:
        found = transfer.carry_deviation(merged, target, found, axes, carry)
    efficiency = math.exp(found.value)
    return Answer(query, INTERPOLATED, ideal / efficiency, found.lines,
                  f"{label} efficiency against {against(used)}, {found.method} (log axes, log efficiency)",
                  details={"efficiency": efficiency, "ideal": ideal, **(details or {})})


def _nearest_held(query: Query, points: Sequence[hull.Point], target: tuple[float, ...], axes: Sequence[str],
                  ideal: float, label: str, used: DevicePeaks | None, outside: str) -> Answer:
    """Outside the hull: the efficiency of the nearest measured row held, the query's own roofline
    time rescaled by it (never a slope carried past the last row), and the reason says so."""
    def distance(p: hull.Point) -> tuple[int, float]:
        # rows that differ from the query on one axis only come first: they share the most with it
        differing = sum(1 for a, b in zip(p.raw, target) if a != b)
        return (0 if differing <= 1 else 1), math.dist([math.log(x) for x in p.raw], [math.log(x) for x in target])

    nearest = min(points, key=distance)
    where = ", ".join(f"{name} {x:g}" for name, x in zip(axes, nearest.raw))
    efficiency = math.exp(nearest.value)
    return Answer(query, FALLBACK, ideal / efficiency, nearest.lines,
                  f"{label} efficiency against {against(used)} of the nearest measured row ({where}), held",
                  reason=outside, details={"efficiency": efficiency, "ideal": ideal})
