"""Interpolation of GEMM rows along one of M, N, K, by efficiency.

A GEMM's time grows with its work ``2*M*N*K`` but not in proportion: small shapes use the
device badly.  Between two measured rows that share two of ``M, N, K`` (and dtypes and the
weight's layout), the efficiency ``2*M*N*K / time`` is interpolated linearly in the log of the
third dimension, and the time is the query's work over it.  This is the cost model's shape of
the Ascend performance model's ``max_interpolation_dim: 1`` policy for MatMulV2/V3 (one
dimension may differ from measured rows).  A query outside the rows' range on every dimension it
could vary gets no answer: the reason names the range; nothing is extrapolated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from perf_plugin.database.shapes import Shape
from perf_plugin.lookup.answer import INTERPOLATED, NONE, Answer, Query
from perf_plugin.lookup.rows import MeasuredRow

DIMS = ("M", "N", "K")
METHOD = "GEMM efficiency, linear in log {dim} between {lo} and {hi}"


@dataclass(frozen=True)
class Gemm:
    m: int
    n: int
    k: int
    layout: str  # "KN": weight [K,N]; "NK": weight [N,K] (transposed)

    @property
    def dims(self) -> tuple[int, int, int]:
        return self.m, self.n, self.k

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def gemm_of(shapes: Sequence[Shape | None]) -> Gemm | None:
    """(M, N, K) and layout of ``x [M,K]; w [K,N] or [N,K]``; None for any other pair."""
    present = [s for s in shapes if s is not None]
    if len(present) < 2 or len(present[0]) != 2 or len(present[1]) != 2:
        return None
    (m, k), w = present[0], present[1]
    if w[0] == k:
        return Gemm(m, w[1], k, "KN")
    if w[1] == k:
        return Gemm(m, w[0], k, "NK")
    return None


def interpolate(query: Query, rows: Sequence[MeasuredRow]) -> Answer:
    wanted = gemm_of(query.input_shapes)
    if wanted is None:
        return Answer(query, NONE, reason="the inputs are not a GEMM's x [M,K] and weight [K,N] / [N,K]")
    measured = []
    for row in rows:
        gemm = gemm_of(row.input_shapes)
        if gemm is not None and row.duration_us is not None and gemm.layout == wanted.layout and _dtypes(row) == _dtypes_q(query):
            measured.append((gemm, row))
    best: tuple[float, Answer] | None = None
    ranges = []
    for axis, dim in enumerate(DIMS):
        line = sorted(((g.dims[axis], g, r) for g, r in measured
                       if all(g.dims[o] == wanted.dims[o] for o in range(3) if o != axis)), key=lambda t: t[0])
        if len(line) < 2:
            continue
        ranges.append(f"{dim} in [{line[0][0]}, {line[-1][0]}]")
        target = wanted.dims[axis]
        below = [t for t in line if t[0] <= target]
        above = [t for t in line if t[0] >= target]
        if not below or not above:
            continue
        (x0, g0, r0), (x1, g1, r1) = below[-1], above[0]
        answer = _between(query, wanted, dim, (x0, g0, r0), (x1, g1, r1), target)
        spread = math.log(x1 / x0) if x1 != x0 else 0.0
        if best is None or spread < best[0]:
            best = (spread, answer)
    if best is not None:
        return best[1]
    reason = ("outside the measured hull: " + "; ".join(ranges)) if ranges else \
        "no two measured rows of these dtypes share two of M, N, K with the query"
    return Answer(query, NONE, reason=reason)


def _between(query: Query, wanted: Gemm, dim: str, low: tuple[int, Gemm, MeasuredRow],
             high: tuple[int, Gemm, MeasuredRow], target: int) -> Answer:
    (x0, g0, r0), (x1, g1, r1) = low, high
    assert r0.duration_us is not None and r1.duration_us is not None
    e0, e1 = g0.flops / r0.duration_us, g1.flops / r1.duration_us
    share = 0.0 if x1 == x0 else math.log(target / x0) / math.log(x1 / x0)
    efficiency = e0 + share * (e1 - e0)
    rows = (r0.line,) if r0 is r1 else (r0.line, r1.line)
    return Answer(query, INTERPOLATED, wanted.flops / efficiency, rows, METHOD.format(dim=dim, lo=x0, hi=x1),
                  details={"efficiency_tflops": efficiency / 1e6})


def _dtypes(row: MeasuredRow) -> tuple[str, ...]:
    return tuple(d for s, d in zip(row.input_shapes, row.input_dtypes) if s is not None)[:2]


def _dtypes_q(query: Query) -> tuple[str, ...]:
    return tuple(d for s, d in zip(query.input_shapes, query.input_dtypes) if s is not None)[:2]
