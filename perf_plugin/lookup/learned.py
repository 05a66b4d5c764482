"""The error of an interpolation along one axis, learned from the family's own measured rows.

Between two measured values of an axis (a GEMM's token counts around the query's) the family's
log efficiency is interpolated on a line (``hull.py``).  Where the library runs another kernel at
the query's value than at its neighbours (cuBLAS changes tile shape, split-K and cooperative
schedule at most token counts that are not multiples of its tiles), the line misses; the other
series of the family measured at the same three values show how often and how far
(``transfer.py`` adds the median of their deviations).  Which of those series tell the query's
case, and how much to trust them, depends on the shapes: here a model learns it.

Every measured row of the family that has measured rows on both sides along the axis, in its own
series, is asked as if it were held out (between its two neighbours, and across one more row on
either side, as a held-out neighbour leaves a query): the two rows, the line between them, and the
median deviations other series show at its value under each notion of alike a family gives
(``transfer.Similar``: for a GEMM, weights of a similar size, of the same N, of the same K, and
every weight), with the axes' values; its measured deviation from the line is what it learns.
A gradient-boosted regression over those rows (scikit-learn's ``HistGradientBoostingRegressor``,
absolute-error loss: the median, which the few rows where cuBLAS's choice is far off cannot
drag) then gives the query's deviation from the same features.  Fewer than ``MIN_EXAMPLES`` such
rows leave it to ``transfer.carry_deviation``.

Measured on an H200 over a dense GEMM grid of 48 token counts (docs/lookup.md, "A learned
deviation"): over four splits the held-out P90 of the bf16 answers went from 7.79-8.26 % to
6.72-6.94 %, of the fp8 answers from 5.91-7.54 % to 5.07-5.58 %, and the medians from
1.28-1.60 % to 1.08-1.40 %; at half the density (1200 rows per kernel type to learn from) the
gain is smaller.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perf_plugin.lookup.hull import Estimate, Point
from perf_plugin.lookup.transfer import MIN_SERIES, Similar, series_along, without

# Fewer rows with neighbours on both sides than this are too few to learn from.
MIN_EXAMPLES = 200
# The spans a row is asked across, in rows below and above it: its two neighbours, and one row
# wider on either side, as a random split leaves a query whose neighbour was held out too (a
# fifth of the rows held out: a third of the queries).  On the H200's dense GEMM grid the wider
# spans took the mean P90 over four splits from 7.08 to 6.86 % (bf16) and 5.53 to 5.29 % (fp8).
SPANS = ((1, 1), (2, 1), (1, 2))
# The regression's settings; the held-out error moved by less than 0.3 points of P90 over
# 200-600 trees, learning rates 0.03-0.05 and 15-31 leaves.
# Every tree is kept (no early stopping, which scikit-learn turns on from 10000 rows and which
# would hold a validation share out): one family answers alike at any size.
_SETTINGS: dict[str, Any] = {"loss": "absolute_error", "max_iter": 300, "learning_rate": 0.05,
                             "max_leaf_nodes": 15, "early_stopping": False, "random_state": 0}
_MODELS_KEPT = 8  # trained models kept per process: a CSV of queries asks one family many times

Series = dict[tuple[float, ...], dict[float, Point]]
_models: OrderedDict[tuple[Any, ...], "_Trained | None"] = OrderedDict()


def features(series: Series, key: tuple[float, ...], axis: int, at: float, low: float, high: float,
             rules: Sequence[Similar], deviations: dict[tuple[float, ...], float] | None = None,
             alike: Sequence[frozenset[tuple[float, ...]]] | None = None) -> list[float]:
    """What the model reads for the point ``at`` of the series ``key`` between ``low`` and ``high``.
    Where many rows are asked, what does not change between them is computed once: every series'
    deviation for the span (``deviations``, ``_deviations``), the series alike to ``key`` under each
    rule (``alike``, ``_alike``)."""
    own = series[key]
    share = _share(at, low, high)
    line = own[low].value + share * (own[high].value - own[low].value)
    if deviations is None:
        deviations = _deviations(series, at, low, high)
    raw = (*key[:axis], at, *key[axis:])
    found = [math.log(x) for x in raw] + [math.log(math.prod(key)), share, math.log(high / low), line,
                                          own[low].value, own[high].value]
    for members in alike if alike is not None else _alike(series, key, rules):
        values = [value for other, value in deviations.items() if other in members]
        found.append(statistics.median(values) if len(values) >= MIN_SERIES else 0.0)
    return found


def _alike(series: Series, key: tuple[float, ...], rules: Sequence[Similar]) -> list[frozenset[tuple[float, ...]]]:
    """Per rule, the other series alike to ``key``."""
    return [frozenset(other for other in series if other != key and rule(key, other)) for rule in rules]


def _share(at: float, low: float, high: float) -> float:
    """Where ``at`` lies between ``low`` and ``high`` on the log axis (0 to 1)."""
    return (math.log(at) - math.log(low)) / (math.log(high) - math.log(low))


def _off_line(along: dict[float, Point], at: float, low: float, high: float) -> float:
    """How far a series lies at ``at`` off its line between ``low`` and ``high``."""
    return along[at].value - (along[low].value + _share(at, low, high) * (along[high].value - along[low].value))


def _deviations(series: Series, at: float, low: float, high: float) -> dict[tuple[float, ...], float]:
    """Every series measured at all three values: how far it lies at ``at`` off its line."""
    return {other: _off_line(along, at, low, high)
            for other, along in series.items() if at in along and low in along and high in along}


def training_set(series: Series, axis: int, rules: Sequence[Similar]) -> tuple[list[list[float]], list[float], int]:
    """Every point with neighbours on both sides in its own series, asked across each of
    ``SPANS`` around it (its features read only the span's two ends, never the point), with its
    deviation from the line between them; and how many points that is."""
    rows: list[list[float]] = []
    targets: list[float] = []
    points = 0
    # the series of a grid share their values: each span's deviations are computed once
    spans: dict[tuple[float, float, float], dict[tuple[float, ...], float]] = {}
    for key, own in series.items():
        values = sorted(own)
        alike = _alike(series, key, rules)
        for i in range(1, len(values) - 1):
            points += 1
            for below, above in SPANS:
                if i - below < 0 or i + above >= len(values):
                    continue
                low, at, high = values[i - below], values[i], values[i + above]
                if (low, at, high) not in spans:
                    spans[low, at, high] = _deviations(series, at, low, high)
                rows.append(features(series, key, axis, at, low, high, rules, spans[low, at, high], alike))
                targets.append(_off_line(own, at, low, high))
    return rows, targets, points


def learned_deviation(points: Sequence[Point], target: tuple[float, ...], found: Estimate, names: Sequence[str],
                      rules: Sequence[Similar]) -> Estimate | None:
    """``found`` (an interpolation along one axis between two measured values) plus the deviation
    the model learned from the family's rows gives; None where it is no such interpolation or the
    family has fewer than ``MIN_EXAMPLES`` rows to learn from."""
    if len(found.axes) != 1 or found.bracket is None:
        return None
    axis = list(names).index(found.axes[0])
    low, high = found.bracket
    if not low < target[axis] < high:
        return None
    trained = _trained(points, axis, rules)
    if trained is None:
        return None
    key = without(target, axis)
    own = trained.series.get(key, {})
    if low not in own or high not in own:
        return None
    deviation = float(trained.model.predict([features(trained.series, key, axis, target[axis], low, high, rules)])[0])
    return Estimate(found.value + deviation, found.lines, found.axes,
                    f"{found.method}, plus the deviation at {found.axes[0]} {target[axis]:g} learned from "
                    f"{trained.rows} rows of the family ({deviation:+.3f} log efficiency)", found.bracket)


@dataclass(frozen=True)
class _Trained:
    model: Any  # the fitted regression
    rows: int  # the family's rows it learned from
    series: Series  # the family's points by series along the axis, which queries read too


def _trained(points: Sequence[Point], axis: int, rules: Sequence[Similar]) -> _Trained | None:
    """The regression trained on ``points`` along ``axis`` (cached per process); None with too few rows."""
    key = (tuple(sorted((p.raw, p.value) for p in points)), axis, tuple(rules))
    if key in _models:
        _models.move_to_end(key)
        return _models[key]
    series = series_along(points, axis)
    rows, targets, count = training_set(series, axis, rules)
    trained = None
    if count >= MIN_EXAMPLES:
        from sklearn.ensemble import HistGradientBoostingRegressor

        trained = _Trained(HistGradientBoostingRegressor(**_SETTINGS).fit(rows, targets), count, series)
    _models[key] = trained
    while len(_models) > _MODELS_KEPT:
        _models.popitem(last=False)
    return trained
