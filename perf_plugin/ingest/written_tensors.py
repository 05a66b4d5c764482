"""The outputs a trace's operators wrote, as candidates for a later operator's inputs.

``perf_plugin.ingest.input_reuse`` walks a trace's operators in device order and pairs each input
with the output that was this tensor: by an execution trace's storage where one names it
(``by_storage``), else by dtype, element count and the shape rules of ``candidates``.  Each output
is kept with when it was written (the bytes moved then) and when its block was released, and with
when it was last read: whole, or, where an execution trace gives a view's offset, per part read
(``part_view``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from perf_plugin.database.shapes import numel
from perf_plugin.database.signature import normalise_dtype
from perf_plugin.ingest.execution_trace import TracedTensor
from perf_plugin.replay.tensors import DTYPES
from perf_plugin.trace.args import Shape, is_contiguous
from perf_plugin.trace.mapped import Slot

# Candidate producers kept per (dtype, element count), and of every kind for strided views: the
# latest outputs are the likely producers, and older ones are long overwritten in the cache.
_KEPT_PER_COUNT = 8
_KEPT_FOR_VIEWS = 64
# The unit a GPU's last-level cache fills from memory: a read of a view brings in whole sectors.
SECTOR_BYTES = 32
# A view read as a part of its tensor: its offset in the storage (elements), its shape and strides.
ViewKey = tuple[int, tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class Written:
    """An operator's output: when it was written and by which operator, when it was released."""

    serial: int  # the output's position among all outputs of the trace
    dtype: str
    shape: tuple[int, ...]
    moved_at_write: float
    spread: float  # half the range of bytes its bytes were written over (``reads_after_write``)
    producer: int
    released_ns: int | None  # when its block was released (None: unknown, or never)

    def alive_at(self, time_ns: int | None) -> bool:
        return time_ns is None or self.released_ns is None or self.released_ns >= time_ns

    @property
    def numel(self) -> int:
        return numel(self.shape)


class RecentOutputs:
    """The recent outputs of the trace, looked up by dtype and element count."""

    def __init__(self) -> None:
        self.by_count: dict[tuple[str, int], list[Written]] = {}
        self.recent: deque[Written] = deque(maxlen=_KEPT_FOR_VIEWS)
        self.serial = 0
        # serial -> (bytes moved halfway through a kernel's last read of it, half that read's bytes)
        self.read_at: dict[int, tuple[float, float]] = {}
        self.converted: dict[str, set[int]] = {}  # dtype -> the serials a Cast has converted to it
        # storage -> its latest write, where an execution trace names storages (``record_storages``)
        self.by_storage: dict[int, Written] = {}
        # serial -> bytes moved between the last use of its storage before it and its write
        self.block_reuse: dict[int, float] = {}
        # (serial, view) -> as ``read_at``, for the last read of that part of it (``part_view``)
        self.view_read_at: dict[tuple[int, ViewKey], tuple[float, float]] = {}

    def last_use(self, written: Written, view: ViewKey | None = None) -> tuple[float, float]:
        """Bytes moved at its last use (write or read), on average over its bytes, and half the
        range; for ``view``, a part of it, the last use of that part (its write, a read of the whole
        tensor, or a read of that very view)."""
        use = self.read_at.get(written.serial, (written.moved_at_write, written.spread))
        part = self.view_read_at.get((written.serial, view)) if view is not None else None
        return use if part is None or part[0] < use[0] else part

    def record_read(self, written: Written, at: tuple[float, float], view: ViewKey | None = None) -> None:
        """A read of ``written`` at ``at`` (as ``read_at``'s values): of the whole, or of ``view``."""
        if view is None:
            self.read_at[written.serial] = at
        else:
            self.view_read_at[(written.serial, view)] = at

    def add(
        self, slot: Slot, at: tuple[float, float], producer: int, released_ns: int | None, now: int | None
    ) -> Written:
        """An output written at ``at`` (bytes moved then, and the half-range of its bytes' writes)."""
        assert slot.shape is not None
        written = Written(
            self.serial, normalise_dtype(slot.dtype), tuple(slot.shape), *at, producer, released_ns
        )
        self.serial += 1
        same = self.by_count.setdefault((written.dtype, written.numel), [])
        # released outputs leave first, so a live one outlasts the temporaries written after it
        same[:] = [c for c in same if c.alive_at(now)]
        same.append(written)
        del same[:-_KEPT_PER_COUNT]
        self.recent.append(written)
        return written

    def record_storages(self, tensors: Sequence[TracedTensor], written: Sequence[Written], producer: int,
                        at: tuple[float, float]) -> None:
        """The storages an operator wrote (an execution trace's), each as the output of its shape
        among ``written`` (a tensor no output slot has stands alone, found by storage only), and how
        many bytes moved since the storage's previous use (``block_reuse``; none where it had none)."""
        unclaimed = list(written)
        for tensor in tensors:
            previous = self.by_storage.get(tensor.storage)
            match = next((w for w in unclaimed if w.shape == tensor.shape), None)
            if match is None:
                match = Written(self.serial, "", tensor.shape, *at, producer, None)
                self.serial += 1
            else:
                unclaimed.remove(match)
            if previous is not None and previous is not match:
                self.block_reuse[match.serial] = at[0] - self.last_use(previous)[0]
            self.by_storage[tensor.storage] = match

    def candidates(
        self, dtype: str, shape: tuple[int, ...], strides: Shape | None, out_shape: Shape | None, now: int | None
    ) -> list[Written]:
        """Outputs that could be this input, newest first."""
        operand = broadcast_operand(shape, out_shape)
        if strides is not None and not is_contiguous(shape, strides) and not operand:
            span = 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))
            return [c for c in reversed(self.recent) if c.dtype == dtype and c.numel >= span and c.alive_at(now)]
        # (a slice's dimensions of 1 may make it contiguous: its strides still show the table)
        base = enclosing_shape(shape, tuple(strides)) if strides is not None and operand else None
        if base is not None and base != shape:  # a slice of a broadcast table (half of a rotary cos)
            table = [c for c in reversed(self.by_count.get((dtype, numel(base)), [])) if c.alive_at(now)]
            return [c for c in table if squeezed(c.shape) == squeezed(base)]
        same = [c for c in reversed(self.by_count.get((dtype, numel(shape)), [])) if c.alive_at(now)]
        return [c for c in same if c.shape == shape or ones_inserted(shape, c.shape)] if operand else same


def part_view(slot: Slot, strides: Shape | None, offset: int | None, whole: Written | None) -> ViewKey | None:
    """The view ``slot`` reads where it reads bytes of ``whole`` that its other views do not: a
    strided view (recorded strides, not contiguous) at a known ``offset``, of fewer elements than
    the tensor, whose contiguous runs fill whole sectors; None for other inputs, read as the whole.

    Jamba's Mamba scan reads step ``i``'s 64-byte run of every channel of a ``[1,8192,512,16]``
    float32 tensor written before the loop.  Counted as reads of the whole tensor, each step's
    read made the next step's input cached (3.7 MB away); ``produced`` then rewrote the whole
    256 MB storage before each repeat, whose dirty lines the kernel paid to evict: 3.07 us against
    2.50 in the model, where each step's run comes from memory (H100; with the slice read from
    memory and a clean cache the replay took 2.50).  A run shorter than a sector shares its sectors
    with the neighbouring views', which a read of those brings into the cache."""
    if offset is None or whole is None or slot.shape is None or strides is None or not slot.shape:
        return None
    shape = tuple(slot.shape)
    if is_contiguous(shape, strides) or numel(shape) >= whole.numel:
        return None
    item = DTYPES.get(normalise_dtype(slot.dtype), ("", 0))[1]
    run = item * (shape[-1] if strides[-1] == 1 else 1)
    return (offset, shape, tuple(strides)) if run >= SECTOR_BYTES else None


def enclosing_shape(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...] | None:
    if not shape or len(shape) != len(strides) or strides[-1] != 1 or any(s <= 0 for s in strides):
        return None
    if any(outer % inner for outer, inner in zip(strides, strides[1:])):
        return None
    base = (shape[0], *(outer // inner for outer, inner in zip(strides, strides[1:])))
    return base if all(whole >= part for whole, part in zip(base, shape)) else None


def ones_inserted(shape: tuple[int, ...], base: tuple[int, ...]) -> bool:
    """Whether ``shape`` is ``base`` with dimensions of 1 inserted: a rotary table written as
    ``[1,1,128]`` and read, unsqueezed, as ``[1,1,1,128]``.  Never the other way: a weight of
    ``[4096]`` is not the ``[1,1,4096]`` activation beside it."""
    if len(base) >= len(shape):
        return False
    matched = 0
    for size in shape:
        if matched < len(base) and size == base[matched]:
            matched += 1
        elif size != 1:
            return False
    return matched == len(base)


def squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(size for size in shape if size != 1)


def broadcast_operand(shape: tuple[int, ...], out_shape: Shape | None) -> bool:
    """Whether an input of ``shape`` is broadcast to the output's shape (fewer dimensions or
    elements, every dimension 1 or the output's)."""
    if out_shape is None or shape == tuple(out_shape) or len(shape) > len(out_shape):
        return False
    if len(shape) == len(out_shape) and numel(shape) >= numel(out_shape):
        return False
    return all(size in (1, out) for size, out in zip(reversed(shape), reversed(tuple(out_shape))))
