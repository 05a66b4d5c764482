"""Interpolation of kernels that stream their inputs: element-wise kernels, norms, casts, copies.

A kernel that reads its inputs once and writes an output as large (``Add``, ``RmsNorm``, ``Cast``,
``TransData``) is bound by the bytes it moves, or, when small, by its launch and the parallelism
its rows give.  An element-wise kernel's one axis is the bytes it moves (an ``[8,4096]`` and a
``[4,8192]`` addition take the same time); a kernel that reduces along the last dimension (a
norm, a softmax) has two, its rows and its width, as its parallelism and its work per row
differ.  Rows of the same input ranks and dtypes whose other inputs relate to the first alike (a
norm's weight as wide as the rows, an addend of the same shape) form one family; inside it the
efficiency against the memory roofline (the device's copy rate; without peaks, bytes per
microsecond) is interpolated in the log of the axes (``efficiency.py``), among the rows the replay
timed in the query's cache state (``cache_state.py``).  Outside the family's hull there is no answer here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perf_plugin.database.shapes import Shape
from perf_plugin.lookup import cache_state, efficiency
from perf_plugin.lookup.answer import NONE, Answer, Query
from perf_plugin.lookup.peaks import DevicePeaks
from perf_plugin.lookup.roofline import Work, scale, tensor_bytes
from perf_plugin.lookup.rows import MeasuredRow

# Kernels that reduce along the last dimension: their parallelism is in the rows, their work per
# row in the width, so both are axes; an element-wise kernel's time follows its bytes alone
# (an [8,4096] and a [4,8192] addition take the same time).
ROW_REDUCTIONS = frozenset({"RmsNorm", "AddRmsNorm", "LayerNorm", "SoftmaxV2", "LogSoftmaxV2"})
ELEMENTWISE_AXES = ("bytes",)
REDUCTION_AXES = ("rows", "width")


def streaming_work(shapes: Sequence[Shape | None], dtypes: Sequence[str]) -> Work | None:
    """The inputs read once and an output as large as the largest written (the same for a row
    and a query, which may not give its outputs)."""
    read = tensor_bytes(shapes, dtypes)
    if read is None:
        return None
    largest = max((tensor_bytes((s,), (d,)) or 0 for s, d in zip(shapes, dtypes) if s is not None), default=0)
    return Work(0.0, read + largest)


def _input_bytes(shapes: Sequence[Shape | None], dtypes: Sequence[str]) -> float:
    return float(tensor_bytes(shapes, dtypes) or 0)


def _position(kernel_type: str, shapes: Sequence[Shape | None], work: Work | None) -> tuple[float, ...] | None:
    first = next((s for s in shapes if s is not None), None)
    if first is None or not first or min(first) <= 0 or work is None:
        return None
    if kernel_type in ROW_REDUCTIONS:
        return float(math.prod(first) // first[-1]), float(first[-1])
    return (float(work.nbytes),)


def _family(shapes: Sequence[Shape | None], dtypes: Sequence[str]) -> tuple[object, ...]:
    """Each present input's rank and dtype, the other inputs' dims named by the first's (``W``:
    its width, ``R``: its rows) where they equal them, and whether the first is one row: a call
    over one row runs another kernel, or the same one over another layout (the portable
    ``SwiGlu``'s halves of one row are contiguous, of more rows strided: on an H100 one row of
    28672 took 2.6 us, two rows of 14336, the same bytes, 4.2)."""
    present = [(s, dtypes[i] if i < len(dtypes) else "") for i, s in enumerate(shapes) if s is not None]
    first_shape = next((s for s in shapes if s is not None), ())
    width = float(first_shape[-1]) if first_shape else 0.0
    rows = float(math.prod(first_shape) // first_shape[-1]) if first_shape and first_shape[-1] else 0.0

    def role(dim: int) -> object:
        return "W" if dim == width else "R" if dim == rows else dim

    first, *others = present
    return (len(first[0]), first[1], rows == 1, *((tuple(role(d) for d in s), t) for s, t in others))


def interpolate(query: Query, rows: Sequence[MeasuredRow], peaks: DevicePeaks | None) -> Answer:
    work = streaming_work(query.input_shapes, query.input_dtypes)
    target = _position(query.kernel_type, query.input_shapes, work)
    if target is None or work is None:
        return Answer(query, NONE, reason="no input shape with a dtype of known size to measure the bytes by")
    family = _family(query.input_shapes, query.input_dtypes)
    members: dict[int, tuple[MeasuredRow, Work, tuple[float, ...]]] = {}
    for row in rows:
        row_work = streaming_work(row.input_shapes, row.input_dtypes)
        position = _position(query.kernel_type, row.input_shapes, row_work)
        if (row.duration_us is not None and position is not None and row_work is not None
                and _family(row.input_shapes, row.input_dtypes) == family):
            members[row.line] = (row, row_work, position)
    # the replay's rotate kept small inputs cached and read larger ones from memory: two curves
    kept = cache_state.same_state([row for row, _, _ in members.values()],
                                  _input_bytes(query.input_shapes, query.input_dtypes),
                                  peaks.cache_bytes if peaks is not None else None,
                                  lambda row: _input_bytes(row.input_shapes, row.input_dtypes))
    points = []
    for row in kept:
        _, row_work, position = members[row.line]
        ideal = scale(row_work, peaks)
        assert ideal is not None and row.duration_us is not None  # bytes only: every peaks file has a copy rate
        points.append(efficiency.point(position, ideal, row.duration_us, row.line))
    ideal = scale(work, peaks)
    assert ideal is not None
    axes = REDUCTION_AXES if query.kernel_type in ROW_REDUCTIONS else ELEMENTWISE_AXES
    return efficiency.answer(query, points, target, axes, ideal, "streaming", peaks,
                             "fewer than two measured rows with these input ranks, dtypes and shapes' relations")
