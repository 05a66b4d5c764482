"""Values on their way from the device to the host, and what the capture keeps of them.

``PendingCopy`` copies a small argument whole (a group list, a router's scores); ``PendingRows``
copies blocks of whole rows of a larger contiguous floating input (``masked_rows.row_blocks``:
32 evenly spaced blocks of about 65536 elements in all), which a softmax's masks, a top-k's
quantiles and selection depths and a GEMM operand's zero share are then taken from.  On an
accelerator the copies go to pinned memory on a side stream of the device's own streams
(``perf_plugin.backends.streams.copy_to_host``), so the profiled step gains no synchronisation;
on the CPU the values are read at once.  What is kept of them is computed in plain Python after
the step, still inside the profiler, where tensor operations would add rows to the trace.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perf_plugin.backends.streams import copy_to_host
from perf_plugin.capture.masked_rows import MaskedRows, masked_rows, row_blocks
from perf_plugin.capture.selection_depth import DTYPES, depth_histogram, rows_along
from perf_plugin.trace.values_file import QUANTILES

if TYPE_CHECKING:
    import torch


def quantiles_of(values: list[float]) -> tuple[float, ...]:
    """``QUANTILES`` values of the sorted ``values`` at even ranks (nearest rank), both ends
    included: equal values stay equal, so ties in the input are ties in the quantiles."""
    ordered = sorted(values)
    last = len(ordered) - 1
    return tuple(float(ordered[round(i * last / (QUANTILES - 1))]) for i in range(QUANTILES))


def zero_share_of(values: Sequence[Any]) -> float:
    """The share of ``values`` that are zero (0.0 for none)."""
    return sum(1 for value in values if value == 0) / max(1, len(values))


def distinct_share_of(values: Sequence[Any]) -> float:
    """The share of ``values`` that are distinct (1.0 for none)."""
    return len(set(values)) / len(values) if values else 1.0


def cumulative(values: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(itertools.accumulate(values))


@dataclass(frozen=True)
class Selection:
    """What a top-k call selects: the ``k`` largest (or smallest) along ``dim``."""

    k: int
    dim: int
    largest: bool


class PendingCopy:
    """Values on their way to the host: a pinned buffer filled on a side stream."""

    def __init__(self, value: Any, streams: dict[Any, Any], counts: bool) -> None:
        self.values: tuple[Any, ...] | None = None
        self.counts = counts  # per-group counts, recorded as their running sums
        # attributes, not operations: reading them adds nothing to the trace
        self.shape = tuple(value.shape) if not isinstance(value, (list, tuple)) else (len(value),)
        self.dtype = str(getattr(value, "dtype", "")).removeprefix("torch.")
        if isinstance(value, (list, tuple)):
            self.values = tuple(int(v) for v in value)
        elif value.device.type == "cpu":  # already on the host: read now, before anything changes them
            # (``tolist`` records no operator that does work; a reshape or clone would add rows)
            self.values = flat(value.tolist())
        else:  # on the device's own streams (torch.npu's on an NPU): perf_plugin.backends.streams
            self.host = copy_to_host(value, streams)

    def _read(self) -> tuple[Any, ...]:
        if self.values is None:
            self.values = flat(self.host.tolist())
        return self.values

    def result(self) -> tuple[int, ...]:
        values = tuple(int(v) for v in self._read())
        return cumulative(values) if self.counts else values

    def quantiles(self) -> tuple[float, ...]:
        return quantiles_of([float(v) for v in self._read()])

    def zero_share(self) -> float:
        return zero_share_of(self._read())

    def distinct_share(self) -> float:
        return distinct_share_of(self._read())

    def depths(self, selection: Selection) -> dict[int, int]:
        """Depth -> rows of the selection's k-th value (``{}`` for a dtype without a pattern)."""
        if self.dtype not in DTYPES or not self.shape:
            return {}
        rows = rows_along([float(v) for v in self._read()], self.shape, selection.dim)
        return depth_histogram(rows, selection.k, selection.largest, self.dtype)


def flat(nested: Any) -> tuple[Any, ...]:
    """``Tensor.tolist()`` of any rank, flattened in row-major order."""
    if not isinstance(nested, list):
        return (nested,)
    out: list[Any] = []
    stack = [iter(nested)]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        else:
            out.append(item)
    return tuple(out)


def readable_rows(value: Any, dim: Any) -> bool:
    """A floating tensor whose rows along ``dim`` are its last dimension's, laid out contiguously:
    blocks of whole rows are then plain copies (no gathering kernel in the profiled step)."""
    import torch

    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dim() == 0:
        return False
    if not isinstance(dim, int) or isinstance(dim, bool) or dim not in (-1, value.dim() - 1):
        return False
    return value.numel() > 0 and value.is_contiguous()


class PendingRows:
    """Blocks of a tensor's rows on their way to the host (``row_blocks``), and their summary."""

    def __init__(self, value: "torch.Tensor", streams: dict[Any, Any]) -> None:
        width = value.shape[-1]
        table = value.view(-1, width)  # a view: no work, and no row in the trace
        blocks = [table[start:stop] for start, stop in row_blocks(table.shape[0], width)]
        self.dtype = str(value.dtype).removeprefix("torch.")
        # on the host already: read now, before anything changes them (``tolist`` records no operator)
        self._read: list[list[Any]] | None = [b.tolist() for b in blocks] if value.device.type == "cpu" else None
        self._copies = [] if self._read is not None else [copy_to_host(b, streams) for b in blocks]

    def _rows(self) -> list[Any]:
        """The rows read (once the copies' stream has been synchronised)."""
        blocks = self._read if self._read is not None else [copy.tolist() for copy in self._copies]
        return [row for block in blocks for row in block]

    def summary(self) -> MaskedRows:
        """The masked rows of the blocks read."""
        return masked_rows(self._rows())

    def quantiles(self) -> tuple[float, ...]:
        return quantiles_of([float(value) for row in self._rows() for value in row])

    def depths(self, selection: Selection) -> dict[int, int]:
        """Depth -> rows read of the selection's k-th value (along the last dimension)."""
        if self.dtype not in DTYPES:
            return {}
        rows = [[float(value) for value in row] for row in self._rows()]
        return depth_histogram(rows, selection.k, selection.largest, self.dtype)

    def zero_share(self) -> float:
        """The share of the elements read that are zero (a GEMM operand's rows of tokens routed
        elsewhere)."""
        return zero_share_of([value for row in self._rows() for value in row])
