"""A kernel's choice at one point of an axis, carried over from the family's other measured series.

Between two measured values of an axis a family's efficiency is interpolated (``hull.py``).  Where
the library picks another kernel at the query's value the two neighbours cannot show it: cuBLAS
changes tile shapes and split-K at token counts that are not multiples of its tiles (160, 320 or
448 rows can take longer than 192, 384 or 512), an attention kernel changes its plan when the KV
length leaves a single block.  Other series of the family (the rows that differ from the query on
other axes: other weights, other batch sizes), measured at the query's value and at the same two
neighbours, do show it: how far their efficiency at the query's value lies off the line between
the neighbours (log efficiency over the log axis) is that choice.  The median of those deviations,
from at least ``MIN_SERIES`` similar series, is added to the query's interpolated log efficiency.

At the edge of its own series (a token count below or above every row of the query's weight) a
query has no two neighbours on its axis, and the hull answers it across other series at its value
(other weights at one token), whose kernels differ more from the query's own than its own nearest
row does.  There ``carry_step`` starts from that row and adds the median step the similar series
take from its value to the query's.

Measured on the H100 and H200 (docs/lookup.md, "How well it answers").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from perf_plugin.lookup.hull import Estimate, Point

# One series measured at the query's value and its neighbours is enough: a kernel's choice there
# (cuBLAS's tile or split-K at a token count, an attention plan leaving one block) shows in every
# alike series, and no deviation at all is the straight line across it.  Waiting for three was
# worse on an H100's dense grids, a fifth held out: FIA P90 over ten splits 2.5-8.2 % against
# 2.3-5.5 % with one; bf16 GEMMs 5.68-6.96 % against 5.37-6.75 % (better on 5 splits of 6), fp8
# 5.65-7.67 % against 4.64-6.40 % (better on all 6); medians lower on every split (docs/lookup.md).
MIN_SERIES = 1

# whether the series at these other-axis values is like the query's (the query's first)
Similar = Callable[[tuple[float, ...], tuple[float, ...]], bool]


def carry_deviation(points: Sequence[Point], target: tuple[float, ...], found: Estimate, names: Sequence[str],
                    similar: Similar) -> Estimate:
    """``found`` (an interpolation along one axis between two measured values) plus the median
    deviation the other ``similar`` series show at the query's value of that axis; unchanged where
    it is no such interpolation or fewer than ``MIN_SERIES`` series measured all three values."""
    if len(found.axes) != 1 or found.bracket is None:
        return found
    axis = list(names).index(found.axes[0])
    low, high, at = *found.bracket, target[axis]
    span = math.log(high) - math.log(low)
    if span <= 0:
        return found
    share = (math.log(at) - math.log(low)) / span
    series = series_along(points, axis)
    mine = without(target, axis)
    deviations: list[float] = []
    lines: list[int] = []
    for key, along in series.items():
        if key == mine or not similar(mine, key):
            continue
        if at in along and low in along and high in along:
            line = along[low].value + share * (along[high].value - along[low].value)
            deviations.append(along[at].value - line)
            lines += [*along[at].lines, *along[low].lines, *along[high].lines]
    if len(deviations) < MIN_SERIES:
        return found
    deviation = statistics.median(deviations)
    return Estimate(found.value + deviation, found.lines + tuple(lines), found.axes,
                    f"{found.method}, plus the median deviation at {found.axes[0]} {at:g} "
                    f"({deviation:+.3f} log efficiency) of {len(deviations)} other series", found.bracket)


def carry_step(points: Sequence[Point], target: tuple[float, ...], names: Sequence[str],
               similar: Similar) -> Estimate | None:
    """At the edge of the query's own series along the first axis (a GEMM's token count below or
    above every row of its weight): the series' nearest row plus the median step from that value
    to the query's that the other ``similar`` series show, where at least ``MIN_SERIES`` measured
    both; else None.  Across other series at the query's value alone (another weight, another
    batch) the library's choice differs; along the query's own axis it changes little between
    neighbouring values, and the step the other series take is that change."""
    at = target[0]
    mine = without(target, 0)
    series = series_along(points, 0)
    own = series.get(mine)
    if not own:
        return None
    anchor = min(own, key=lambda x: abs(math.log(x) - math.log(at)))
    steps: list[float] = []
    lines: list[int] = []
    for key, along in series.items():
        if key != mine and similar(mine, key) and at in along and anchor in along:
            steps.append(along[at].value - along[anchor].value)
            lines += [*along[at].lines, *along[anchor].lines]
    if len(steps) < MIN_SERIES:
        return None
    step = statistics.median(steps)
    return Estimate(own[anchor].value + step, own[anchor].lines + tuple(lines), (names[0],),
                    f"the nearest row of its series ({names[0]} {anchor:g}) plus the median step to "
                    f"{names[0]} {at:g} ({step:+.3f} log efficiency) of {len(steps)} other series")


def series_along(points: Sequence[Point], axis: int) -> dict[tuple[float, ...], dict[float, Point]]:
    """The points by series (their other axes' values), each by its value of ``axis``."""
    series: dict[tuple[float, ...], dict[float, Point]] = {}
    for point in points:
        series.setdefault(without(point.raw, axis), {})[point.raw[axis]] = point
    return series


def without(raw: tuple[float, ...], axis: int) -> tuple[float, ...]:
    """The other axes' values: which series a point belongs to."""
    return raw[:axis] + raw[axis + 1:]


def every_series(mine: tuple[float, ...], other: tuple[float, ...]) -> bool:
    """Every other series of the family (attention: its other batches, lengths and spreads)."""
    return True


def same_axis(index: int) -> Similar:
    """Series that share the query's value of one other axis (``index`` among the other axes:
    a GEMM's K is index 1 of (N, K))."""
    def test(mine: tuple[float, ...], other: tuple[float, ...]) -> bool:
        return other[index] == mine[index]
    return test


def within(ratio: float) -> Similar:
    """Series whose other axes' product lies within ``ratio`` of the query's (a GEMM's weight size
    N * K: weights of a similar size meet the same family of kernels)."""
    def test(mine: tuple[float, ...], other: tuple[float, ...]) -> bool:
        return abs(math.log(math.prod(other) / math.prod(mine))) <= math.log(ratio)
    return test
