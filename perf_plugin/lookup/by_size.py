"""Interpolation of rows by the bytes their inputs hold: element-wise kernels, norms, copies.

A kernel that streams its inputs once (``Add``, ``RmsNorm``, ``Cast``, ``TransData``) takes a time
that grows with the bytes it reads.  Among rows of the kernel type with the query's dtypes and
input ranks, the two whose input bytes bracket the query's give the time, linear in bytes between
them (the Ascend performance model's ``generic_compute`` policy reads output elements for
ConcatD, GatherV2 and Index in the same way).  Outside the rows' range there is no answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perf_plugin.database.shapes import Shape
from perf_plugin.lookup.answer import INTERPOLATED, NONE, Answer, Query
from perf_plugin.lookup.rows import MeasuredRow
from perf_plugin.replay.tensors import DTYPES

METHOD = "linear in input bytes between {lo} and {hi}"


def input_bytes(shapes: Sequence[Shape | None], dtypes: Sequence[str]) -> int | None:
    total = 0
    for shape, dtype in zip(shapes, dtypes):
        if shape is None:
            continue
        if dtype not in DTYPES:
            return None
        total += math.prod(shape) * DTYPES[dtype][1]
    return total


def _kind(shapes: Sequence[Shape | None], dtypes: Sequence[str]) -> tuple[tuple[int, str], ...]:
    """What must agree between rows: each present input's rank and dtype."""
    return tuple((len(s), d) for s, d in zip(shapes, dtypes) if s is not None)


def interpolate(query: Query, rows: Sequence[MeasuredRow]) -> Answer:
    target = input_bytes(query.input_shapes, query.input_dtypes)
    if target is None:
        return Answer(query, NONE, reason="an input dtype without a known size")
    kind = _kind(query.input_shapes, query.input_dtypes)
    line = sorted(
        ((size, row) for row in rows
         if row.duration_us is not None and _kind(row.input_shapes, row.input_dtypes) == kind
         and (size := input_bytes(row.input_shapes, row.input_dtypes)) is not None),
        key=lambda pair: pair[0],
    )
    if len(line) < 2:
        return Answer(query, NONE, reason="fewer than two measured rows with these input ranks and dtypes")
    below = [pair for pair in line if pair[0] <= target]
    above = [pair for pair in line if pair[0] >= target]
    if not below or not above:
        return Answer(query, NONE, reason=f"outside the measured hull: input bytes in [{line[0][0]}, {line[-1][0]}], "
                                          f"the query's {target}")
    (b0, r0), (b1, r1) = below[-1], above[0]
    assert r0.duration_us is not None and r1.duration_us is not None
    share = 0.0 if b1 == b0 else (target - b0) / (b1 - b0)
    duration = r0.duration_us + share * (r1.duration_us - r0.duration_us)
    rows_used = (r0.line,) if r0 is r1 else (r0.line, r1.line)
    return Answer(query, INTERPOLATED, duration, rows_used, METHOD.format(lo=b0, hi=b1))
