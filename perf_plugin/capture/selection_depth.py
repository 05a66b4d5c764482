"""How close a top-k's k-th value lies to the other values of its row: its selection depth.

A radix selection (CUDA's ``sbtopk::gatherTopK``, one thread block per row) narrows each row to
its k-th value a few bits at a time, from the top of an order-preserving bit pattern of the
values down, and stops as soon as no other value of the row shares the bits read so far; a value
tied with another is never alone, and its row runs through every digit.  The rows of one launch
run side by side, so the kernel takes as long as its deepest rows.  A router's scores are a
softmax of bfloat16 logits: two experts with equal logits give equal scores, and over 512 tokens
a few rows tie at the k-th value.  On an H200, Mixtral's [512, 8] top-2 took 7.8-7.9 us on the
router's own scores, 6.0 us on values drawn from their quantiles (no row ties) and 7.9-8.0 us
on those draws rebuilt to the router's depths (``reproduce/wip/topk_selection_depth.py``).

A row's depth is the number of leading bits the k-th value's pattern shares with the nearest
other value of the row (its neighbours in sorted order): the pattern's width where they tie.
The pattern is the one radix selections sort by: the sign bit flipped for a positive value, every
bit for a negative one, in the value's own width (16 bits for float16 and bfloat16).

This module is plain Python: the capture computes depths after the profiled step, still inside
the profiler, where tensor operations would add rows to the trace.  The replay rebuilds its drawn
rows to the recorded depths with the same functions (``with_depths``).
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Mapping, Sequence

# dtype name -> (struct format of the value, struct format of its bits, width in bits);
# bfloat16 is the top half of a float32.
_FORMATS: dict[str, tuple[str, str, int]] = {
    "float64": ("<d", "<Q", 64),
    "float32": ("<f", "<I", 32),
    "float16": ("<e", "<H", 16),
    "bfloat16": ("<f", "<I", 16),
}
DTYPES = tuple(_FORMATS)


def width_of(dtype: str) -> int:
    return _FORMATS[dtype][2]


def ordered_key(value: float, dtype: str) -> int:
    """The value's bit pattern, flipped so that the patterns sort as the values do."""
    value_format, bits_format, width = _FORMATS[dtype]
    bits = int(struct.unpack(bits_format, struct.pack(value_format, value))[0])
    if dtype == "bfloat16":
        bits >>= 16
    top = 1 << (width - 1)
    return bits ^ top if bits & top == 0 else ~bits & ((1 << width) - 1)


def value_of_key(key: int, dtype: str) -> float:
    """The value whose ``ordered_key`` is ``key``."""
    value_format, bits_format, width = _FORMATS[dtype]
    top = 1 << (width - 1)
    bits = key ^ top if key & top else ~key & ((1 << width) - 1)
    if dtype == "bfloat16":
        bits <<= 16
    (value,) = struct.unpack(value_format, struct.pack(bits_format, bits))
    return float(value)


def shared_bits(a: int, b: int, width: int) -> int:
    """Leading bits two patterns of ``width`` bits share."""
    return width - (a ^ b).bit_length()


def _depth_at(ordered: Sequence[int], position: int, width: int) -> int:
    neighbours = [ordered[j] for j in (position - 1, position + 1) if 0 <= j < len(ordered)]
    return max((shared_bits(ordered[position], n, width) for n in neighbours), default=0)


def rows_along(flat: Sequence[float], shape: Sequence[int], dim: int) -> list[list[float]]:
    """The slices of a row-major ``flat`` tensor of ``shape`` along ``dim``, one list each."""
    if not shape:
        return [list(flat)]
    dim %= len(shape)
    length, inner = shape[dim], math.prod(shape[dim + 1 :])
    outer = math.prod(shape[:dim])
    return [
        [flat[(o * length + i) * inner + j] for i in range(length)]
        for o in range(outer)
        for j in range(inner)
    ]


def row_depths(rows: Sequence[Sequence[float]], k: int, largest: bool, dtype: str) -> list[int]:
    """Each row's selection depth for its k-th largest (or smallest) value; rows of no more
    than k values select everything and have none."""
    width = width_of(dtype)
    depths = []
    for row in rows:
        if not 0 < k < len(row):
            continue
        ordered = sorted((ordered_key(v, dtype) for v in row), reverse=largest)
        depths.append(_depth_at(ordered, k - 1, width))
    return depths


def depth_histogram(rows: Sequence[Sequence[float]], k: int, largest: bool, dtype: str) -> dict[int, int]:
    """Depth -> how many rows selected at that depth."""
    return dict(sorted(Counter(row_depths(rows, k, largest, dtype)).items()))


def depths_for_rows(histogram: Mapping[int, int], rows: int) -> list[int]:
    """``rows`` depths spread over ``histogram`` as evenly as its ranks allow: the depth at rank
    ``(i + 0.5) / rows`` of the recorded rows, deepest last (a row that ties in one call of
    several may be too rare to keep; one row gets the median)."""
    pooled = [depth for depth, count in sorted(histogram.items()) for _ in range(count)]
    if not pooled or rows <= 0:
        return []
    return [pooled[min(len(pooled) - 1, int((i + 0.5) * len(pooled) / rows))] for i in range(rows)]


def with_depth(row: Sequence[float], k: int, largest: bool, dtype: str, depth: int) -> list[float]:
    """``row`` with its neighbours of the k-th value moved so that its selection depth is
    ``depth``: values too close moved just out of reach, and where none then lies at that depth,
    the nearest neighbour moved to it (onto the k-th value itself for a tie).  Ranks do not
    change, but where a neighbour must cross over; a row that would need a value past the
    type's finite range, or of no more than k values, comes back as it was."""
    width = width_of(dtype)
    if not 0 < k < len(row):
        return list(row)
    flip = 0 if largest else (1 << width) - 1  # a smallest-first selection reads the patterns upside down
    flipped = [ordered_key(value, dtype) ^ flip for value in row]
    order = sorted(range(len(row)), key=flipped.__getitem__, reverse=True)
    keys = [flipped[i] for i in order]
    depth = max(0, min(depth, width))
    if not _spread(keys, k - 1, depth, width) or not _join(keys, k - 1, depth, width):
        return list(row)
    rebuilt = list(row)
    for position, i in enumerate(order):
        rebuilt[i] = value_of_key(keys[position] ^ flip, dtype)
    return rebuilt if _kept_finite(row, rebuilt) else list(row)


def _kept_finite(row: Sequence[float], rebuilt: Sequence[float]) -> bool:
    """No NaN and no more infinities than the row had (scores masked to ``-inf`` stay)."""
    infinite = sum(math.isinf(v) for v in row)
    return not any(math.isnan(v) for v in rebuilt) and sum(math.isinf(v) for v in rebuilt) <= infinite


def _spread(keys: list[int], position: int, depth: int, width: int) -> bool:
    """Move the values (largest first) sharing more than ``depth`` bits with the k-th just out of
    its block of ``depth + 1`` bits, each on its own side.  False where that leaves the range."""
    if depth >= width:
        return True
    size = 1 << (width - depth - 1)
    start = keys[position] & ~(size - 1)
    end = start + size - 1
    for j, key in enumerate(keys):
        if j < position and key <= end:
            if end + 1 >= 1 << width:
                return False
            keys[j] = end + 1
        elif j > position and key >= start:
            if start == 0:
                return False
            keys[j] = start - 1
    return True


def _join(keys: list[int], position: int, depth: int, width: int) -> bool:
    """Where no value shares exactly ``depth`` bits with the k-th, move its nearest neighbour
    there: below it where that bit of the k-th is set (or for a tie), else above it."""
    if _depth_at(keys, position, width) == depth:
        return True
    kth = keys[position]
    bit = 1 << (width - depth - 1) if depth < width else 0
    below = bit == 0 or kth & bit != 0
    target = position + 1 if below else position - 1
    if not 0 <= target < len(keys):  # no neighbour on that side: the one on the other crosses over
        target = position - 1 if below else position + 1
    if not 0 <= target < len(keys):
        return False
    keys[target] = kth ^ bit
    keys.sort(reverse=True)
    return True
