"""The roofline of a kernel's work on a device: what interpolation rescales by, and the last answer.

A kernel's ``Work`` is the floating-point operations it must do (at the dtype whose peak bounds
them) and the bytes it must move.  With the device's measured peaks (``peaks.py``) its ideal time
is ``max(flops / peak(dtype), bytes / copy rate)``.  Lookups hold a measured row's *efficiency*
(ideal time over measured time) and rescale the query's ideal time by it, so a shape between two
measured ones inherits how well the device ran them, while the roofline supplies how the work
itself changed.  Without a peaks file the scale is the work in the unit that bounds it (flops for
GEMMs, bytes for streaming kernels): the same interpolation, with a constant peak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from perf_plugin.database.shapes import Shape
from perf_plugin.lookup.peaks import DevicePeaks
from perf_plugin.replay.tensors import DTYPES


@dataclass(frozen=True)
class Work:
    flops: float
    nbytes: float
    dtype: str = ""  # the dtype whose GEMM peak bounds ``flops`` ("": none)


def element_size(dtype: str) -> int | None:
    return DTYPES[dtype][1] if dtype in DTYPES else None


def tensor_bytes(shapes: Sequence[Shape | None], dtypes: Sequence[str]) -> int | None:
    """The bytes of the present tensors; None when one has a dtype of unknown size."""
    total = 0
    for index, shape in enumerate(shapes):
        if shape is None:
            continue
        size = element_size(dtypes[index]) if index < len(dtypes) else None
        if size is None:
            return None
        total += math.prod(shape) * size
    return total


def ideal_us(work: Work, peaks: DevicePeaks) -> tuple[float, str] | None:
    """The roofline time of ``work`` and which roof bounds it; None without a peak for its dtype."""
    memory = peaks.memory_us(work.nbytes)
    if work.flops <= 0:
        return memory, "memory"
    compute = peaks.compute_us(work.flops, work.dtype)
    if compute is None:
        return None
    return (compute, "compute") if compute >= memory else (memory, "memory")


def scale(work: Work, peaks: DevicePeaks | None) -> float | None:
    """What a row's efficiency is relative to: its roofline time, or (no peaks) its work."""
    if peaks is not None:
        ideal = ideal_us(work, peaks)
        return None if ideal is None else ideal[0]
    return work.flops if work.flops > 0 else work.nbytes


def describe_roofline(work: Work, peaks: DevicePeaks) -> str:
    ideal = ideal_us(work, peaks)
    if ideal is None:
        return f"no {work.dtype} GEMM peak in {peaks.path or 'the peaks file'}"
    where = peaks.path.name if peaks.path is not None else "device peaks"
    return (f"roofline of {where} ({peaks.device}): {work.flops / 1e9:.4g} GFLOP, {work.nbytes / 1e6:.4g} MB, "
            f"{ideal[1]}-bound")
