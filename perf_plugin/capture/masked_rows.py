"""Which elements of a softmax's rows are masked, and how they lie in the row: ``masked_rows``.

A softmax's time depends on its values: an element far below its row's maximum takes the device's
slower exponential.  On an H200, ``softmax_warp_forward`` over GPT-OSS's prefill logits
([1, 64, 512, 513] bf16) took 40.5 us on random values, 52.3 us with the causal mask's half of
each row at the dtype's lowest value (or ``-inf``), 58.2 us with a 128-token sliding window's
78 %, and 62.5 us with the same half masked at random places, since a warp's 32 lanes then
almost all meet one.  Masked elements in one run per row took 52.2 us, in 4 runs 55.6 us, in 16
runs 61.3 us (``reproduce/wip/softmax_masked_values.py``).  So a call records, per input, the
share of its elements that are masked and the mean number of runs of them per row.

An element is masked when its exponential relative to its row's maximum is below float32's
smallest normal number (``x - max < ln 2**-126``): ``-inf``, a dtype's lowest value (the masks
of ``transformers``), a logit 90 below the best.  Logits 60 below were not slower (80 below
already were: 55.5 us; those between are rare in a model and counted unmasked).

Rows lie along the last dimension, the one ``SoftmaxV2`` rows are replayed over.  A tensor larger
than ``budget`` elements is read in evenly spaced blocks of whole rows (a causal mask's rows
differ from first to last), each a plain copy to the host (``perf_plugin.capture.pending_copies``).
The share and runs are taken in plain Python: the capture reads the values after the profiled
step, still inside the profiler, where tensor operations would add rows to the trace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# ln of float32's smallest normal number: an exponential below it is a denormal or zero.
UNDERFLOW = math.log(2.0 ** -126)
# Whole rows read per call at most, as elements, and the blocks they are spread over.
BUDGET = 65536
BLOCKS = 32


@dataclass(frozen=True)
class MaskedRows:
    """The share of the elements read that were masked, and the mean runs of them per row read."""

    share: float
    runs: float


def row_blocks(rows: int, width: int, budget: int = BUDGET, blocks: int = BLOCKS) -> list[tuple[int, int]]:
    """(start, stop) row ranges to read of a [rows, width] table: all of it when it fits in
    ``budget`` elements, else up to ``blocks`` evenly spaced ranges of consecutive rows holding
    about ``budget`` elements in all (at least one row)."""
    if rows <= 0 or width <= 0:
        return []
    if rows * width <= budget:
        return [(0, rows)]
    wanted = max(1, budget // width)
    count = min(blocks, wanted)
    per_block = max(1, wanted // count)
    last_start = rows - per_block
    # one block: the middle rows (a causal mask's typical ones), not the first
    starts = sorted({round(i * last_start / (count - 1)) for i in range(count)} if count > 1 else {last_start // 2})
    return [(start, start + per_block) for start in starts]


def masked_rows(rows: Sequence[Sequence[float]]) -> MaskedRows:
    """The masked share and the mean masked runs per row of ``rows``."""
    elements = masked = runs = 0
    for row in rows:
        top = max(row, default=-math.inf)
        previous = False
        for value in row:
            # a row of -inf alone has no maximum to be below (NaN compares False): nothing masked
            below = value - top < UNDERFLOW
            masked += below
            runs += below and not previous
            previous = below
        elements += len(row)
    if not elements:
        return MaskedRows(0.0, 0.0)
    return MaskedRows(masked / elements, runs / len(rows))
