"""Interpolation of grouped MoE GEMM rows by rows and expert load.

A grouped GEMM (``GroupedMatmul``: ``x [M,K]``, ``weight [E,K,N]`` or ``[E,N,K]``, a group list)
does ``2*M*N*K`` operations and reads every expert's weight, but how long it takes depends on
how the rows split between the experts: a busy expert's group spills into more tiles while the
others idle.  A row's split is its ``Input Values`` (the group list's cumulative ends, measured in
a model or a grid's named load); without one, the replay draws even groups.  Rows of the same
experts, K, N, weight layout and dtypes form one family; inside it the efficiency against the
roofline is interpolated in ``log M`` and ``log`` of the split's tile excess (its M-tiles over the
fewest the rows could take: 1 for groups that pack into whole tiles) (``efficiency.py``), and the query's time is its roofline
time over that efficiency.  The roofline counts each group's rows in whole M-tiles, each tile
reading its expert's weight: the cost a skewed split adds that the shapes do not show.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perf_plugin.database.shapes import Shape, parse_shape_cell
from perf_plugin.lookup import efficiency
from perf_plugin.lookup.answer import NONE, Answer, Query
from perf_plugin.lookup.peaks import DevicePeaks
from perf_plugin.lookup.roofline import Work, element_size, scale
from perf_plugin.lookup.rows import MeasuredRow

KERNEL_TYPES = frozenset({"GroupedMatmul"})
AXES = ("tile excess", "rows")
# The rows of one M-tile of the grouped GEMM kernels the roofline assumes (Hopper's CUTLASS
# grouped GEMMs and Ascend's both tile M by 128): a modelling choice, named in every answer's work.
M_TILE = 128


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


def group_sizes(values: str, experts: int, rows: int) -> tuple[int, ...] | None:
    """The rows per group, from an ``Input Values`` cell (cumulative ends); even groups without
    a cell (what the replay draws then); None for a cell that is not such a list."""
    if not values:
        return tuple(rows // experts + (1 if g < rows % experts else 0) for g in range(experts))
    try:
        slots = parse_shape_cell(values)
    except ValueError:
        return None
    for ends in slots:
        if ends is not None and len(ends) == experts and ends[-1] == rows and rows > 0:
            return tuple(end - start for start, end in zip((0, *ends), ends))
    return None


def tile_excess(sizes: Sequence[int]) -> float:
    """The split's M-tiles over the fewest its rows could take: 1 when the groups pack into whole
    tiles, up to the experts' count when every group is a sliver of one.  Of the load's
    summaries this one tells the kernel's time apart best (held-out error on the H100: median
    1.6 % against 2.6 % for the busiest group over the mean)."""
    rows = sum(sizes)
    return sum(math.ceil(g / M_TILE) for g in sizes) / max(1, math.ceil(rows / M_TILE))


def imbalance(values: str, experts: int, rows: int) -> float | None:
    """The busiest group's rows over the mean (1.0: even groups); None for a cell that is not a group list."""
    sizes = group_sizes(values, experts, rows)
    return None if sizes is None or rows <= 0 else max(sizes) / (rows / experts)


def _work(sizes: Sequence[int], k: int, n: int, dtypes: Sequence[str]) -> Work:
    """Each group's rows padded to whole M-tiles, each tile streaming its expert's weight: what a
    grouped GEMM kernel does (an empty group costs nothing), so that a skewed split's extra
    tiles are in the roofline and the interpolation is left with what the model does not say."""
    x, w = (element_size(d) or 2 for d in dtypes[:2])
    m = sum(sizes)
    tiles = sum(math.ceil(g / M_TILE) for g in sizes)
    return Work(2.0 * tiles * M_TILE * n * k, m * k * x + tiles * k * n * w + m * n * x, dtypes[0])


def query_work(query: Query) -> Work | None:
    gemm = _gemm(query.input_shapes)
    sizes = None if gemm is None else group_sizes(query.input_values, gemm[1], gemm[0])
    return None if gemm is None or sizes is None else _work(sizes, gemm[2], gemm[3], query.input_dtypes)


def interpolate(query: Query, rows: Sequence[MeasuredRow], peaks: DevicePeaks | None) -> Answer:
    wanted = _gemm(query.input_shapes)
    if wanted is None:
        return Answer(query, NONE, reason="the inputs are not a grouped GEMM's x [M,K] and weight [E,K,N] / [E,N,K]")
    m, e, k, n, layout = wanted
    sizes = group_sizes(query.input_values, e, m)
    if sizes is None or m <= 0:
        return Answer(query, NONE, reason=f"Input Values {query.input_values!r} holds no group list of {e} "
                                          f"cumulative ends reaching {m} rows")
    family = (e, k, n, layout, tuple(query.input_dtypes[:2]))
    load = max(sizes) / (m / e)
    query_work = _work(sizes, k, n, query.input_dtypes)
    used = peaks if peaks is not None and scale(query_work, peaks) is not None else None
    points = []
    for row in rows:
        gemm = _gemm(row.input_shapes)
        if gemm is None or row.duration_us is None or (*gemm[1:], tuple(row.input_dtypes[:2])) != family:
            continue
        row_sizes = group_sizes(row.cells.get("Input Values", "").strip().strip('"'), e, gemm[0])
        if row_sizes is None or gemm[0] <= 0:
            continue
        ideal = scale(_work(row_sizes, k, n, row.input_dtypes), used)
        if ideal is not None:
            points.append(efficiency.point((tile_excess(row_sizes), float(gemm[0])), ideal,
                                           row.duration_us, row.line))
    ideal = scale(query_work, used)
    assert ideal is not None
    return efficiency.answer(query, points, (tile_excess(sizes), float(m)), AXES, ideal, "grouped GEMM", used,
                             "fewer than two measured rows of these experts, K, N, layout and dtypes",
                             {"imbalance": load})
