"""Interpolation of grouped MoE GEMM rows by rows and expert load.

A grouped GEMM (``GroupedMatmul``: ``x [M,K]``, ``weight [E,K,N]`` or ``[E,N,K]``, a group list)
does ``2*M*N*K`` operations and reads every expert's weight, but how long it takes depends on
how the rows split between the experts: a busy expert's group spills into more tiles while the
others idle.  A row's split is its ``Input Values`` (the group list's cumulative ends, measured in
a model or a grid's named load); without one, the replay draws even groups.  Rows of the same
experts, K, N, weight layout and dtypes form one family; inside it the efficiency against the
roofline is interpolated in ``log M`` and ``log`` of the load's imbalance (the busiest expert's
rows over the mean: 1 for even groups) (``hull.py``), and the query's time is its roofline time
over that efficiency.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perf_plugin.database.shapes import Shape, parse_shape_cell
from perf_plugin.lookup import hull
from perf_plugin.lookup.answer import INTERPOLATED, NONE, Answer, Query
from perf_plugin.lookup.peaks import DevicePeaks
from perf_plugin.lookup.roofline import Work, element_size, scale
from perf_plugin.lookup.rows import MeasuredRow

KERNEL_TYPES = frozenset({"GroupedMatmul"})
AXES = ("rows", "imbalance")


def _gemm(shapes: Sequence[Shape | None]) -> tuple[int, int, int, int, str] | None:
    """(M, E, K, N, weight layout) of ``x [M,K]; weight [E,K,N] or [E,N,K]``."""
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None or len(shapes[0]) != 2 or len(shapes[1]) != 3:
        return None
    (m, k), (e, a, b) = shapes[0], shapes[1]
    if a == k:
        return m, e, k, b, "EKN"
    if b == k:
        return m, e, k, a, "ENK"
    return None


def imbalance(values: str, experts: int, rows: int) -> float | None:
    """The busiest group's rows over the mean, from an ``Input Values`` cell (cumulative ends);
    1.0 without a cell (the replay's even groups); None for a cell that is not such a list."""
    if not values:
        return 1.0
    try:
        slots = parse_shape_cell(values)
    except ValueError:
        return None
    for ends in slots:
        if ends is not None and len(ends) == experts and ends[-1] == rows and rows > 0:
            sizes = [end - start for start, end in zip((0, *ends), ends)]
            return max(sizes) / (rows / experts)
    return None


def _work(m: int, e: int, k: int, n: int, dtypes: Sequence[str]) -> Work:
    x, w = (element_size(d) or 2 for d in dtypes[:2])
    return Work(2.0 * m * n * k, m * k * x + e * k * n * w + m * n * x, dtypes[0])


def query_work(query: Query) -> Work | None:
    gemm = _gemm(query.input_shapes)
    return None if gemm is None else _work(gemm[0], gemm[1], gemm[2], gemm[3], query.input_dtypes)


def interpolate(query: Query, rows: Sequence[MeasuredRow], peaks: DevicePeaks | None) -> Answer:
    wanted = _gemm(query.input_shapes)
    if wanted is None:
        return Answer(query, NONE, reason="the inputs are not a grouped GEMM's x [M,K] and weight [E,K,N] / [E,N,K]")
    m, e, k, n, layout = wanted
    load = imbalance(query.input_values, e, m)
    if load is None:
        return Answer(query, NONE, reason=f"Input Values {query.input_values!r} holds no group list of {e} "
                                          f"cumulative ends reaching {m} rows")
    family = (e, k, n, layout, tuple(query.input_dtypes[:2]))
    query_work = _work(m, e, k, n, query.input_dtypes)
    used = peaks if peaks is not None and scale(query_work, peaks) is not None else None
    points = []
    for row in rows:
        gemm = _gemm(row.input_shapes)
        if gemm is None or row.duration_us is None or (*gemm[1:], tuple(row.input_dtypes[:2])) != family:
            continue
        row_load = imbalance(row.cells.get("Input Values", "").strip().strip('"'), e, gemm[0])
        ideal = scale(_work(gemm[0], e, k, n, row.input_dtypes), used)
        if row_load is not None and ideal is not None:
            points.append(hull.Point((float(gemm[0]), row_load), ideal / row.duration_us, (row.line,)))
    if len(points) < 2:
        return Answer(query, NONE, reason="fewer than two measured rows of these experts, K, N, layout and dtypes")
    found = hull.estimate(hull.merge(points), (float(m), load), AXES, (math.log, math.log))
    if isinstance(found, str):
        return Answer(query, NONE, reason=found)
    ideal = scale(query_work, used)
    assert ideal is not None
    against = "the roofline" if used else "operations"
    return Answer(query, INTERPOLATED, ideal / found.value, found.lines,
                  f"grouped GEMM efficiency against {against}, {found.method} (log axes)",
                  details={"efficiency": found.value, "imbalance": load})
