"""Interpolation of GEMM rows in (M, N, K) by efficiency against the roofline.

A GEMM's time grows with its work but not in proportion: small shapes use the device badly,
and a skinny one is bound by the bytes of its weight rather than by its ``2*M*N*K`` operations.
A measured row's efficiency is its roofline time (``roofline.py``: the device's measured peaks)
over its measured time; between measured rows of the same dtypes, weight layout and formats the
efficiency is interpolated in ``log M, log N, log K`` (``hull.py``: one dimension first, then two,
then three), plus the deviation other weights of similar size show at the query's token count
(``transfer.py``: the library's choice of kernel there; with enough rows, a model learns that
deviation from the family's own rows, ``learned.py``), and the query's time is its own
roofline time over that efficiency.  Without a peaks file the efficiency is operations per
microsecond, the same method with a constant peak.  A query
outside the rows' hull gets no answer here; the lookup says so and gives the roofline instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perf_plugin.database.shapes import Shape
from perf_plugin.lookup import efficiency
from perf_plugin.lookup.answer import NONE, Answer, Query
from perf_plugin.lookup.peaks import DevicePeaks
from perf_plugin.lookup.roofline import Work, element_size, scale
from perf_plugin.lookup.rows import MeasuredRow
from perf_plugin.lookup.transfer import every_series, same_axis, within

DIMS = ("M", "N", "K")
# weights within 2x of the query's N * K meet the same family of kernels (transfer.py)
WEIGHTS_ALIKE = within(2.0)
# weights of the query's K step alike between token counts: K decides split-K, and a token count
# below or above every row of the query's weight takes the step they take (transfer.carry_step);
# weights of a similar size but another K do not (1 row of a K = 7168 weight takes 17 % longer than
# 2 rows on an H100, of weights of other K 0-3 %)
SAME_REDUCTION = same_axis(1)
# what the learned deviation (learned.py) reads: the deviations of weights of a similar size, of
# the query's N (its tiles across the output), of its K (its split-K), and of every weight
LEARNED_ALIKE = (WEIGHTS_ALIKE, same_axis(0), SAME_REDUCTION, every_series)


@dataclass(frozen=True)
class Gemm:
    m: int
    n: int
    k: int
    layout: str  # "KN": weight [K,N]; "NK": weight [N,K] (transposed); "square": either
    batch: int = 1  # a batched GEMM's leading dimension

    @property
    def dims(self) -> tuple[int, int, int]:
        return self.m, self.n, self.k

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


def gemm_of(shapes: Sequence[Shape | None]) -> Gemm | None:
    """(M, N, K) and layout of ``x [M,K]; w [K,N] or [N,K]`` (or the batched ``[B,M,K]; [B,K,N]``);
    None for any other pair."""
    present = [s for s in shapes if s is not None]
    if len(present) < 2 or len(present[0]) != len(present[1]) or len(present[0]) not in (2, 3):
        return None
    batch = 1
    x, w = present[0], present[1]
    if len(x) == 3:
        if x[0] != w[0]:
            return None
        batch, x, w = x[0], x[1:], w[1:]
    (m, k) = x
    if w[0] == k and w[1] == k:
        return Gemm(m, k, k, "square", batch)  # the shapes do not say which way the weight lies
    if w[0] == k:
        return Gemm(m, w[1], k, "KN", batch)
    if w[1] == k:
        return Gemm(m, w[0], k, "NK", batch)
    return None


def gemm_work(gemm: Gemm, dtypes: Sequence[str], output_dtype: str) -> Work:
    sizes = [element_size(d) or 2 for d in (*dtypes[:2], output_dtype or dtypes[0])]
    m, n, k = gemm.dims
    nbytes = gemm.batch * (m * k * sizes[0] + k * n * sizes[1] + m * n * sizes[2])
    return Work(gemm.flops, nbytes, dtypes[0])


def _regime(shapes: Sequence[Shape | None], dtypes: Sequence[str], formats: Sequence[str],
            batch: int) -> tuple[object, ...]:
    present = [i for i, s in enumerate(shapes) if s is not None]
    kinds = tuple(dtypes[i] if i < len(dtypes) else "" for i in present)
    layouts = tuple((formats[i] if i < len(formats) else "") or "ND" for i in present[:2])
    return kinds, layouts, batch, len(present)


def same_layout(a: str, b: str) -> bool:
    return a == b or "square" in (a, b)


def _output_dtype(row: MeasuredRow) -> str:
    from perf_plugin.database.shapes import split_slots
    from perf_plugin.database.signature import normalise_dtype

    found = [normalise_dtype(d) for d in split_slots(row.cells.get("Output Data Types", "")) if d.strip()]
    return found[0] if found else ""


def interpolate(query: Query, rows: Sequence[MeasuredRow], peaks: DevicePeaks | None) -> Answer:
    wanted = gemm_of(query.input_shapes)
    if wanted is None:
        return Answer(query, NONE, reason="the inputs are not a GEMM's x [M,K] and weight [K,N] / [N,K]")
    formats = query.input_formats or ("ND",) * len(query.input_shapes)
    regime = _regime(query.input_shapes, query.input_dtypes, formats, wanted.batch)
    query_work = gemm_work(wanted, _present_dtypes(query.input_shapes, query.input_dtypes),
                           query.output_dtypes[0] if query.output_dtypes else "")
    # a dtype without a measured peak (INT8) is rescaled by operations, as without a peaks file
    used = peaks if peaks is not None and scale(query_work, peaks) is not None else None
    points = []
    for row in rows:
        gemm = gemm_of(row.input_shapes)
        if gemm is None or row.duration_us is None:
            continue
        row_formats = row.input_formats if query.input_formats else ("ND",) * len(row.input_shapes)
        if not same_layout(gemm.layout, wanted.layout) or \
                _regime(row.input_shapes, row.input_dtypes, row_formats, gemm.batch) != regime:
            continue
        work = gemm_work(gemm, _present_dtypes(row.input_shapes, row.input_dtypes), _output_dtype(row))
        ideal = scale(work, used)
        if ideal is not None:
            points.append(efficiency.point(tuple(map(float, gemm.dims)), ideal, row.duration_us, row.line))
    ideal = scale(query_work, used)
    assert ideal is not None
    return efficiency.answer(query, points, tuple(map(float, wanted.dims)), DIMS, ideal, "GEMM", used,
                             "fewer than two measured rows of these dtypes, layout and formats",
                             carry=WEIGHTS_ALIKE, step=SAME_REDUCTION, learn=LEARNED_ALIKE)


def _present_dtypes(shapes: Sequence[Shape | None], dtypes: Sequence[str]) -> tuple[str, ...]:
    return tuple(dtypes[i] if i < len(dtypes) else "" for i, s in enumerate(shapes) if s is not None)


def query_work(query: Query) -> Work | None:
    wanted = gemm_of(query.input_shapes)
    if wanted is None:
        return None
    return gemm_work(wanted, _present_dtypes(query.input_shapes, query.input_dtypes),
                     query.output_dtypes[0] if query.output_dtypes else "")
