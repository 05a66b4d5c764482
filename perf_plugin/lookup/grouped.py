"""Interpolation of grouped MoE GEMM rows by rows and expert load.

A grouped GEMM (``GroupedMatmul``: ``x [M,K]``, ``weight [E,K,N]`` or ``[E,N,K]``, a group list)
does ``2*M*N*K`` operations, but how long it takes depends on how the rows split between the
experts: a busy expert's group spills into more tiles while the others idle, and an expert no
row chose is not read.  A row's split is its ``Input Values`` (the group list's cumulative ends,
measured in a model or a grid's named load); without one, the replay draws even groups.  Rows of
the same experts, K, N, weight layout and dtypes form one family (and, for the CUDA replay's
rows, of the same kernel: ``cutlass_tiling``); inside it the efficiency against the roofline is
interpolated in ``log M`` and ``log`` of a summary of the split (``efficiency.py``), and the
query's time is its roofline time over that efficiency.

Where the kernel and the device's multiprocessors are known (the CUDA replay's rows, a peaks file
that records them), the roofline counts the operations of every wave of tiles over the device
and each used expert's weight once, and the split is read by its load spread (the experts over
its effective experts).  Otherwise each group's rows fill whole 128-row tiles, each tile reading
its expert's weight, and the split is read by its tile excess (``_work``): the cost a skewed split
adds that the shapes do not show.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from perf_plugin.backends.cuda import CudaBackend
from perf_plugin.database.schema import MICROBENCH_BACKEND
from perf_plugin.database.shapes import Shape, parse_shape_cell
from perf_plugin.lookup import efficiency
from perf_plugin.lookup.answer import NONE, Answer, Query
from perf_plugin.lookup.peaks import DevicePeaks
from perf_plugin.lookup.roofline import Work, element_size, scale
from perf_plugin.lookup.rows import MeasuredRow

KERNEL_TYPES = frozenset({"GroupedMatmul"})
WAVE_AXES = ("load spread", "rows")
TILE_AXES = ("tile excess", "rows")
# The rows of one M-tile of a grouped GEMM kernel whose tiling is not known (Ascend's tiles M by
# 128): a modelling choice, named in every answer's work.
M_TILE = 128


@dataclass(frozen=True)
class Tiling:
    """A grouped GEMM kernel's output tile (``n`` None: unknown, N not tiled) and how many tiles
    along M one cluster of multiprocessors takes together."""

    m: int
    n: int | None = None
    cluster: int = 1


UNKNOWN_TILING = Tiling(M_TILE)


def cutlass_tiling(m: int, experts: int, n: int) -> Tiling:
    """The kernel PyTorch's CUTLASS grouped GEMM runs on Hopper (``torch._grouped_mm`` in bf16,
    ``GroupMM.cu``): 64 x 128 tiles (ping-pong) where the mean group has at most 128 rows or N is
    at most 128, else 128 x 256 (cooperative), both in clusters of two along M.  The H100's rows
    name these kernels, switching between 128 and 192 rows per expert in every family."""
    return Tiling(64, 128, 2) if m // max(1, experts) <= 128 or n <= 128 else Tiling(128, 256, 2)


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
    """The split's 128-row M-tiles over the fewest its rows could take: 1 when the groups pack
    into whole tiles, up to the experts' count when every group is a sliver of one.  The load's
    axis where the waves are not known: it follows the tiles that roofline counts."""
    rows = sum(sizes)
    return sum(math.ceil(g / M_TILE) for g in sizes) / max(1, math.ceil(rows / M_TILE))


def load_spread(sizes: Sequence[int]) -> float:
    """The experts over the split's effective experts (the exponential of the entropy of its
    shares): 1 for even groups, the experts' count when one takes every row.  Of the load's
    summaries tried, this one tells the kernel's time apart best (held-out P90 on the H100's
    dense grid, two splits, with the waves and the kernel: 6.0 % against 7.8-8.7 % for the
    split's M-tiles over the fewest its rows need, 7.6-8.0 % for the busiest group over the
    mean, 6.4-6.6 % for the experts over the inverse sum of squared shares)."""
    rows = sum(sizes)
    if rows <= 0:
        return 1.0
    entropy = -sum(g / rows * math.log(g / rows) for g in sizes if g)
    return len(sizes) / math.exp(entropy)


def imbalance(values: str, experts: int, rows: int) -> float | None:
    """The busiest group's rows over the mean (1.0: even groups); None for a cell that is not a group list."""
    sizes = group_sizes(values, experts, rows)
    return None if sizes is None or rows <= 0 else max(sizes) / (rows / experts)


def _work(sizes: Sequence[int], k: int, n: int, dtypes: Sequence[str], tiling: Tiling = UNKNOWN_TILING,
          units: int | None = None) -> Work:
    """Each group's rows in whole tiles.  Without the kernel's tiling or the device's ``units``
    (multiprocessors), each tile streams its expert's weight and writes its output whole.  With
    both: the operations of every wave of clusters over the device (a last wave partly idle costs
    a whole one), each used expert's weight read once, since the tiles of one expert running
    together share it, and the output of every wave's tiles, whole."""
    x, w = (element_size(d) or 2 for d in dtypes[:2])
    m = sum(sizes)
    if tiling.n is None or not units:
        tiles = sum(math.ceil(g / tiling.m) for g in sizes)
        output = tiles * tiling.m * n * x
        return Work(2.0 * tiles * tiling.m * n * k, m * k * x + tiles * k * n * w + output, dtypes[0])
    clusters = sum(math.ceil(math.ceil(g / tiling.m) / tiling.cluster) for g in sizes) * math.ceil(n / tiling.n)
    waves = math.ceil(clusters / max(1, units // tiling.cluster))
    used = sum(1 for g in sizes if g)
    # A wave lasts as long as its fullest tiles, for their output writes as for their operations,
    # so the output too is counted as every wave's tiles, whole.  Where K is narrow the writes
    # bound the kernel: 384 rows per expert of 128 (three M-tiles, the second cluster half empty)
    # was answered 17 % short from the exact output bytes (H100, K = 96, N = 4096).
    output = waves * units * tiling.m * tiling.n * x
    return Work(2.0 * waves * units * tiling.m * tiling.n * k, m * k * x + used * k * n * w + output, dtypes[0])


def query_work(query: Query) -> Work | None:
    gemm = _gemm(query.input_shapes)
    sizes = None if gemm is None else group_sizes(query.input_values, gemm[1], gemm[0])
    return None if gemm is None or sizes is None else _work(sizes, gemm[2], gemm[3], query.input_dtypes)


def _replayed_on_cuda(measured: Sequence[MeasuredRow]) -> bool:
    """Whether every measured row is the CUDA replay's, which runs ``torch._grouped_mm``."""
    return bool(measured) and all(row.cells.get(MICROBENCH_BACKEND, "") == CudaBackend.name for row in measured)


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
    members = [(row, gemm[0]) for row in rows if row.duration_us is not None
               and (gemm := _gemm(row.input_shapes)) is not None and gemm[0] > 0
               and (*gemm[1:], tuple(row.input_dtypes[:2])) == family]
    cuda = _replayed_on_cuda([row for row, _ in members])
    tiling = cutlass_tiling(m, e, n) if cuda else UNKNOWN_TILING
    units = peaks.compute_units if peaks is not None else None
    # the waves where the kernel and the multiprocessors are known; else tiles streaming weights
    waves = cuda and units is not None
    work_tiling, axes = (tiling, WAVE_AXES) if waves else (UNKNOWN_TILING, TILE_AXES)

    def position(split: Sequence[int], rows_m: int) -> tuple[float, float]:
        return (load_spread(split) if waves else tile_excess(split)), float(rows_m)

    query_work = _work(sizes, k, n, query.input_dtypes, work_tiling, units)
    used = peaks if peaks is not None and scale(query_work, peaks) is not None else None
    points = []
    for row, rows_m in members:
        if cuda and cutlass_tiling(rows_m, e, n) != tiling:  # another kernel: its own efficiency
            continue
        row_sizes = group_sizes(row.cells.get("Input Values", "").strip().strip('"'), e, rows_m)
        ideal = None if row_sizes is None else scale(_work(row_sizes, k, n, row.input_dtypes, work_tiling, units), used)
        if row_sizes is not None and ideal is not None and row.duration_us is not None:
            points.append(efficiency.point(position(row_sizes, rows_m), ideal, row.duration_us, row.line))
    ideal = scale(query_work, used)
    assert ideal is not None
    kernel = "" if tiling == UNKNOWN_TILING else f" run by the {tiling.m} x {tiling.n} tile's kernel"
    return efficiency.answer(query, points, position(sizes, m), axes, ideal, f"grouped GEMM{kernel}", used,
                             f"fewer than two measured rows of these experts, K, N, layout and dtypes{kernel}",
                             {"imbalance": max(sizes) / (m / e)})
