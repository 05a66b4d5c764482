"""Interpolation of a measured quantity inside the hull of measured points, lowest dimension first.

Every kernel family reduces a row to a few continuous axes (a GEMM's M, N, K; an attention's
batch and lengths; a grouped GEMM's rows and expert load) and a value to interpolate (its
efficiency).  A query is answered from the rows that differ from it on as few axes as possible:
first along one axis (the two rows around it, on the first axis the family lists that has
them, or the axis whose two rows lie closest), then over two, then over
all, by barycentric weights in the Delaunay simplex that holds it (scipy's Qhull).  Each axis may
be transformed first (a logarithm: shapes grow geometrically).  A query outside every such hull
gets no estimate, and the reason gives the measured range of every axis: nothing is extrapolated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Transform = Callable[[float], float]


@dataclass(frozen=True)
class Point:
    raw: tuple[float, ...]  # the axes' values as rows give them (M, N, K ...)
    value: float
    lines: tuple[int, ...]  # the CSV lines it stands for (rows at one point are averaged)


@dataclass(frozen=True)
class Estimate:
    value: float
    lines: tuple[int, ...]
    axes: tuple[str, ...]  # the axes it interpolates over
    method: str
    bracket: tuple[float, float] | None = None  # along one axis: the two measured values around the query


def merge(points: Sequence[Point]) -> list[Point]:
    """One point per distinct position, its value the mean of the rows there."""
    groups: dict[tuple[float, ...], list[Point]] = {}
    for point in points:
        groups.setdefault(point.raw, []).append(point)
    return [Point(raw, sum(p.value for p in group) / len(group), tuple(line for p in group for line in p.lines))
            for raw, group in groups.items()]


def estimate(points: Sequence[Point], target: tuple[float, ...], names: Sequence[str],
             transforms: Sequence[Transform], max_dim: int | None = None, narrowest: bool = False) -> Estimate | str:
    """The value at ``target`` from ``points`` (one per position: ``merge``), or why there is none.
    Along one axis: the first of ``names`` with rows on both sides, or (``narrowest``) the axis
    whose two rows lie closest (transformed)."""
    dims = len(names)
    for point in points:
        if point.raw == target:  # rows at the query's position that another cell told apart
            where = ", ".join(f"{name} {_text(x)}" for name, x in zip(names, target))
            return Estimate(point.value, point.lines, (), f"at a measured position ({where})")
    coords = [tuple(t(x) for t, x in zip(transforms, p.raw)) for p in points]
    aim = tuple(t(x) for t, x in zip(transforms, target))
    for order in range(1, min(dims, max_dim or dims) + 1):
        found: list[tuple[float, Estimate]] = []
        for axes in itertools.combinations(range(dims), order):
            fixed = [o for o in range(dims) if o not in axes]
            chosen = [i for i, p in enumerate(points) if all(p.raw[o] == target[o] for o in fixed)]
            if len(chosen) < order + 1:
                continue
            if order == 1:
                result = _bracket(points, coords, chosen, aim, axes[0], names)
            else:
                result = _simplex(points, coords, chosen, aim, axes, names)
            if result is not None:
                found.append(result)
        if found:
            # along one axis, the first the family lists (the rows that share the most with the
            # query: a GEMM's M, its weight's other rows); over more, the tightest simplex
            return found[0][1] if order == 1 and not narrowest else min(found, key=lambda pair: pair[0])[1]
    return "outside the measured hull: " + measured_ranges(points, names)


def measured_ranges(points: Sequence[Point], names: Sequence[str]) -> str:
    if not points:
        return "no measured rows"
    return "; ".join(f"{name} in [{_text(min(p.raw[i] for p in points))}, {_text(max(p.raw[i] for p in points))}]"
                     for i, name in enumerate(names))


def _text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


def _bracket(points: Sequence[Point], coords: Sequence[tuple[float, ...]], chosen: Sequence[int],
             aim: tuple[float, ...], axis: int, names: Sequence[str]) -> tuple[float, Estimate] | None:
    below = [i for i in chosen if coords[i][axis] <= aim[axis]]
    above = [i for i in chosen if coords[i][axis] >= aim[axis]]
    if not below or not above:
        return None
    low = max(below, key=lambda i: coords[i][axis])
    high = min(above, key=lambda i: coords[i][axis])
    x0, x1 = coords[low][axis], coords[high][axis]
    share = 0.0 if x1 == x0 else (aim[axis] - x0) / (x1 - x0)
    value = points[low].value + share * (points[high].value - points[low].value)
    lines = points[low].lines + (points[high].lines if high != low else ())
    lo, hi = _text(points[low].raw[axis]), _text(points[high].raw[axis])
    return x1 - x0, Estimate(value, lines, (names[axis],), f"linear in {names[axis]} between {lo} and {hi}",
                             (points[low].raw[axis], points[high].raw[axis]))


def _simplex(points: Sequence[Point], coords: Sequence[tuple[float, ...]], chosen: Sequence[int],
             aim: tuple[float, ...], axes: tuple[int, ...], names: Sequence[str]) -> tuple[float, Estimate] | None:
    import numpy as np
    from scipy.spatial import Delaunay, QhullError

    sites = np.array([[coords[i][a] for a in axes] for i in chosen])
    where = np.array([aim[a] for a in axes])
    try:
        triangulation = Delaunay(sites)
    except (QhullError, ValueError):
        return None  # the points lie in a lower-dimensional plane: no simplex holds the query
    simplex = int(triangulation.find_simplex(where))
    if simplex < 0:
        return None
    transform = triangulation.transform[simplex]
    partial = transform[: len(axes)].dot(where - transform[len(axes)])
    weights = [*partial, 1.0 - float(partial.sum())]
    vertices = [chosen[int(v)] for v in triangulation.simplices[simplex]]
    value = sum(w * points[v].value for w, v in zip(weights, vertices))
    spread = max(math.dist(sites[chosen.index(v)], where) for v in vertices)
    lines = tuple(line for v in vertices for line in points[v].lines)
    label = ", ".join(names[a] for a in axes)
    return spread, Estimate(value, lines, tuple(names[a] for a in axes),
                            f"barycentric in ({label}) over {len(vertices)} rows around the query")
