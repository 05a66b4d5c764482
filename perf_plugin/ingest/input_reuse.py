"""How recently the device wrote each input of a traced operator: its reuse distance in bytes.

Whether a kernel finds its inputs in the last-level cache decides much of a short kernel's
duration: on an H100 a decode-sized element-wise kernel whose inputs all come from the cache
runs ~0.3 us faster than one that reads any input from memory, a fifth of its time.  In a model
an activation the previous kernel wrote is in the cache; a parameter, or an activation written
before a GEMM streamed a layer's weights through the cache, is not.  A replay can set up either
state per input (``perf_plugin.replay.cache_modes``) if the row says which.

Where an execution trace lies beside the profile, it names each input's storage, and its
producer is the latest operator that wrote that storage, or none
(``perf_plugin.ingest.execution_trace``).  Otherwise, and for the slots it does not name, the
profiler records no tensor identities, so the producer of an input is inferred from the
sequence of operators in device order: the latest earlier operator with an output of the same
dtype and element count (a reshaped view keeps the count; of one producer's outputs, one of the
same shape first), each output feeding at most one slot of a consumer.  Where the profile holds
the allocator's events, an output released before the consumer started is no candidate
(``perf_plugin.ingest.tensor_lifetimes``), and a conversion (``Cast``) takes no output already
converted to its dtype (``_conversion``).  Some inputs match more narrowly or widely:

* an operand broadcast against an element-wise operator's output (a norm's weight of shape
  ``[4096]`` times activations of ``[1,1,4096]``, a rotary ``cos`` of ``[1,1,1,128]``) matches
  only an output of its very shape, or of that shape with dimensions of 1 left out (the rotary
  table written as ``[1,1,128]`` and unsqueezed): such operands are a model's parameters or
  tables built once, and the element count alone would pair a weight with the activation beside
  it.  Operands choose before the operator's other inputs, which match by element count and
  would otherwise take an operand's writer: Gemma's norm ``x * (1 + w)`` read ``1 + w`` as ``x``
  and then found no writer for its operand;
* a strided view (a recorded non-contiguous layout, such as the half of a head that rotary
  embedding negates) matches the latest output whose elements cover the view's span: it reads
  part of a larger tensor;
* a strided view that is also broadcast (half of a rotary ``cos`` table of ``[1,1,1,64]``, read
  as ``[1,1,1,32]`` against ``[1,16,1,32]`` heads) matches an output of the table's shape (the
  view's enclosing shape, its dimensions of 1 aside): matched on its own shape it found no
  writer, and DeepSeek-V3's decode rotary ``mul`` read the table from memory in its replay
  (1.13-1.16x its in-model duration on an H200, 1.2 % of that model's kernel time).

The distance is the bytes the device moved between the tensor's last use and this read, as a
cache that evicts the least recently used lines sees it: every operator's inputs and outputs in
between, and of the operator that last used it (its producer, or an earlier reader) its outputs
and the share of its inputs it read after the write (``reads_after_write``).  An element-wise
operator writes as it reads, so an element is written on average halfway through its reads.  A
contraction (a GEMM, attention, a reduction: it reads many times the bytes it writes) writes
each output tile after the tile's last read; where all its tiles fit one wave of the device
(a decode GEMM's few output columns, a split-K reduction) every write comes after every read,
and the next kernel finds the output in the cache however many weights were streamed.  Counting
half the reads there put a decode step's logits 98 MB away from the ``argmax`` that reads them
(half of a 197 MB vocabulary projection) and the replays evicted what the model found cached:
1.16-1.20x their in-model durations on an H200.  A norm's float32 copy of the activations, read by
``pow`` and then scaled, is as far as the traffic after ``pow``, not after its write.  A read
counts only where no other live tensor could have been the one read.  An input no earlier operator produced (a
model's parameter, data from before the profile) has no distance.

Where the inference guesses wrong: without the allocator's events, a shape many tensors share
(a decode step's residual stream, ``[1,1,hidden]``) can pair an input with another writer of
that shape than its own, a temporary long released; a broadcast operand built under another
shape and then reshaped (a routing weight of ``[8]`` read as ``[8,1]``) finds no writer and
counts as read from memory.  On three decoder models profiled on an H100 with the allocator's
events, replays that follow the distances put 93.7-97.4 % of the kernel time within 10 % of the
in-model durations (``benchmarks/model_coverage.py``, profiles E and F; README, "Coverage of real
profiles").

A read of a strided view of part of a tensor refreshes only that part where the execution trace
gives the view's offset (``written_tensors.part_view``): a scan's step reads its own slice of a
tensor written before the loop, not the slice the step before it read.

A row's cell (``Profiling Input Reuse Distance(B)``) holds, per input slot, the median over the
row's calls, ``-`` where most calls had no producer; the replay compares it with its device's
cache size.

That distance is the average over the tensor's bytes; its bytes were last used over a range
around it (``Profiling Input Reuse Spread(B)``: half that range).  An element-wise producer writes
its output as it reads, so its first bytes have all its reads after them and its last none; a
contraction writes each wave of tiles after that wave's reads, so its last wave is as fresh as
the next kernel and its first has the later waves' reads after it; a reader's read is spread over
its own reads.  A replay keeps in its cache the share of the input that range puts within it:
a decode step's ``argmax`` over a 102400-word vocabulary reads logits that a GEMV of 1.56 waves
wrote, a third of them in its last wave, still cached, the rest evicted by the later waves'
weights; counted whole (its average 76 MB away), its replays read them all from memory and took
1.10-1.115x their in-model durations on an H200 (3-3.8 % of two models' kernel time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from perf_plugin.database.shapes import numel
from perf_plugin.database.signature import normalise_dtype
from perf_plugin.ingest.execution_trace import SlotStorages
from perf_plugin.ingest.written_tensors import (
    RecentOutputs,
    ViewKey,
    Written,
    broadcast_operand,
    enclosing_shape,
    ones_inserted,
    part_view,
    squeezed,
)
from perf_plugin.replay.aten_call import recorded_operator
from perf_plugin.replay.tensors import DTYPES
from perf_plugin.trace.args import Shape, broadcast, is_contiguous
from perf_plugin.trace.mapped import MappedOp, Slot

# Kernel types of MoE GEMMs over per-expert weights (``read_bytes``).
GROUPED_GEMMS = frozenset({"GroupedMatmul"})
# Kernel types that concatenate their inputs (``_passed_again``).
CONCATENATIONS = frozenset({"ConcatD"})
# An operator that reads this many times the bytes it writes is a contraction (``reads_after_write``):
# a decode GEMM reads its weights thousands of times over, a prefill GEMM 6-10 times, an
# element-wise operator one to three.
CONTRACTION_RATIO = 16
# The output elements one wave of a contraction's tiles covers: 132 SMs (H100, H200) times 512,
# the widest tile of the decode GEMMs seen.  cuBLAS widens a decode GEMM's tile until its output
# fits one wave where it can (on an H200: 256 columns for a 32064-word vocabulary, 384 for 50304,
# and 512 for 102400, which still takes 1.5 waves).  A prefill GEMM's output spans many such
# waves, and is counted as written throughout, as an element-wise operator's is.
ONE_WAVE_ELEMENTS = 2**16


def slot_bytes(slot: Slot) -> int:
    if slot.shape is None:
        return 0
    size = DTYPES.get(normalise_dtype(slot.dtype), ("", 0))[1]
    return numel(slot.shape) * size


def read_bytes(op: MappedOp) -> int:
    """The bytes ``op`` reads: its input slots', but of a grouped GEMM's per-expert weights
    (``[experts, ...]``) only the share of the experts its groups routed rows to, where an
    input-value capture recorded its groups (the cumulative end row of each, ``Input Values``): a
    decode step's few tokens read a few experts' weights, not the layer's."""
    used = _experts_used(op) if op.kernel_type in GROUPED_GEMMS else None
    total = 0
    for slot in op.inputs:
        size = slot_bytes(slot)
        if used is not None and slot.shape is not None and len(slot.shape) == 3 and slot.shape[0] == used[1]:
            size = size * used[0] // used[1]
        total += size
    return total


def _experts_used(op: MappedOp) -> tuple[int, int] | None:
    """(groups with rows, groups) of the first slot whose values are cumulative group ends."""
    for ends in op.values:
        if ends and len(ends) > 1 and ends[0] >= 0 and all(b >= a for a, b in zip(ends, ends[1:])):
            return sum(1 for start, end in zip((0, *ends), ends) if end > start), len(ends)
    return None


def reuse_distances(
    ops: Sequence[MappedOp],
    starts: Sequence[int] | None = None,
    released: Sequence[tuple[int | None, ...]] | None = None,
    storages: Sequence[SlotStorages | None] | None = None,
) -> list[tuple[float, ...]]:
    """Per operator (in device order), per input slot, the bytes moved since the input was last
    used (``math.inf``: no earlier operator produced it).  ``starts`` (each operator's start) and
    ``released`` (per operator, when each output's block was released: ``tensor_lifetimes``)
    rule out outputs released before a consumer started.  ``storages`` (per operator, from an
    execution trace: ``perf_plugin.ingest.execution_trace``) name the tensors: an input whose
    storage is known has the latest operator that wrote that storage as its producer, or none."""
    return reuse_distances_and_spreads(ops, starts, released, storages)[0]


def reuse_distances_and_spreads(
    ops: Sequence[MappedOp],
    starts: Sequence[int] | None = None,
    released: Sequence[tuple[int | None, ...]] | None = None,
    storages: Sequence[SlotStorages | None] | None = None,
) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]]]:
    """``reuse_distances``, and per slot half the range of bytes moved over which the input's
    bytes were last used (``math.inf`` where it has no producer): its bytes lie that far either
    side of its distance."""
    reuse = input_reuse(ops, starts, released, storages)
    return reuse.distances, reuse.spreads


class InputReuse(NamedTuple):
    """Per operator (in device order), per input slot: ``reuse_distances``, their spreads
    (``reuse_distances_and_spreads``), and the bytes moved between the last use of the input's
    storage before its producer wrote it and that write (``math.inf`` where no execution trace
    named the storage or it had no earlier use): whether the producer wrote into lines in the cache."""

    distances: list[tuple[float, ...]]
    spreads: list[tuple[float, ...]]
    block_reuse: list[tuple[float, ...]]


def input_reuse(
    ops: Sequence[MappedOp],
    starts: Sequence[int] | None = None,
    released: Sequence[tuple[int | None, ...]] | None = None,
    storages: Sequence[SlotStorages | None] | None = None,
) -> InputReuse:
    """What ``InputReuse`` holds, for ``ops`` (the arguments as ``reuse_distances``')."""
    outputs = RecentOutputs()
    moved = 0.0
    distances: list[tuple[float, ...]] = []
    spreads: list[tuple[float, ...]] = []
    blocks: list[tuple[float, ...]] = []
    for index, op in enumerate(ops):
        now = starts[index] if starts is not None else None
        known = storages[index] if storages is not None else None
        matched = _matched_inputs(op, known, outputs, now)
        views = _views(op, known, matched)
        last_uses = [outputs.last_use(chosen, view) if chosen is not None else None
                     for (chosen, _), view in zip(matched, views)]
        distances.append(tuple(math.inf if use is None else moved - use[0] for use in last_uses))
        spreads.append(tuple(math.inf if use is None else use[1] for use in last_uses))
        blocks.append(tuple(math.inf if chosen is None else outputs.block_reuse.get(chosen.serial, math.inf)
                            for chosen, _ in matched))
        read = read_bytes(op)
        # inputs are read halfway through this operator; only a read whose tensor no other could
        # be counts, since a wrong pairing refreshed by every read would keep a tensor long
        # evicted (a layer's key cache read as its value cache) in the cache
        for (written, sole), view in zip(matched, views):
            if written is not None and sole:
                outputs.record_read(written, (moved + read / 2, read / 2), view)
        after = reads_after_write(op)
        ends = released[index] if released is not None else ()
        _record_outputs(op, outputs, index, (moved + read - after, after), ends, now, known)
        moved += read + sum(slot_bytes(slot) for slot in op.outputs)
    return InputReuse(distances, spreads, blocks)


def _matched_inputs(
    op: MappedOp, known: SlotStorages | None, outputs: RecentOutputs, now: int | None
) -> list[tuple[Written | None, bool]]:
    """Per input slot, the output it read (None: none in the trace) and whether it was the only
    operator's output that could be it: by the execution trace's storage where it names one,
    else by the shape rules (``_producer``)."""
    conversion = _conversion(op)
    # outputs already matched to a slot of this operator; a conversion's one input joins the
    # outputs converted to its dtype, which no later conversion to it takes (``_conversion``)
    used = set() if conversion is None else outputs.converted.setdefault(conversion, set())
    out_shape = _broadcast_target(op)
    strides = list(op.strides) + [None] * (len(op.inputs) - len(op.strides))
    matched: list[tuple[Written | None, bool]] = [(None, False)] * len(op.inputs)
    taken: list[Written] = []  # this operator's earlier slots' tensors
    # the broadcast operands choose first: they match only outputs of their shape, and a
    # slot of the output's shape taken first could take theirs (a norm's ``x * (1 + w)``)
    for position in sorted(range(len(op.inputs)), key=lambda k: not _is_operand(op.inputs[k], out_shape)):
        slot, view = op.inputs[position], strides[position]
        storage = known.inputs[position] if known is not None and position < len(known.inputs) else None
        if storage is not None:  # the tensor itself: its storage's latest writer, or none
            chosen, sole = outputs.by_storage.get(storage), True
        else:
            chosen, sole = _producer(slot, view, out_shape, outputs, used, now)
            if chosen is None and op.kernel_type in CONCATENATIONS:
                chosen = _passed_again(slot, view, taken)
        matched[position] = (chosen, sole)
        taken += [chosen] if chosen is not None else []
    return matched


def _views(op: MappedOp, known: SlotStorages | None, matched: Sequence[tuple[Written | None, bool]]) -> list[ViewKey | None]:
    """Per input slot, the part of its tensor it read (``part_view``), where an execution trace
    gave its view's offset."""
    offsets = known.offsets if known is not None else ()
    return [part_view(slot, op.strides[k] if k < len(op.strides) else None, offsets[k] if k < len(offsets) else None,
                      chosen) for k, (slot, (chosen, _)) in enumerate(zip(op.inputs, matched))]


def _record_outputs(op: MappedOp, outputs: RecentOutputs, index: int, written_at: tuple[float, float],
                    ends: tuple[int | None, ...], now: int | None, known: SlotStorages | None) -> None:
    """The operator's outputs (and a base it wrote through a view) as candidates for later inputs,
    and the storages an execution trace says it wrote."""
    writes = []
    for position, slot in enumerate(op.outputs):
        if slot.shape is not None:
            end = ends[position] if position < len(ends) else None
            writes.append(outputs.add(slot, written_at, index, end, now))
    for base in written_base(op):
        outputs.add(base, written_at, index, None, now)
    if known is not None:
        outputs.record_storages(known.written, writes, index, written_at)


def reads_after_write(op: MappedOp) -> float:
    """The bytes of its inputs ``op`` reads, on average, after writing an output element.

    Half its reads for an element-wise operator.  A contraction (at least ``CONTRACTION_RATIO``
    times the bytes read that it writes) writes a tile after the tile's reads; of ``W`` waves of
    tiles (its output elements over ``ONE_WAVE_ELEMENTS``) the average tile is followed by
    ``(W - 1) / 2W`` of the reads: none in one wave, half in many."""
    read = read_bytes(op)
    written = sum(slot_bytes(slot) for slot in op.outputs)
    if read < CONTRACTION_RATIO * written or written == 0:
        return read / 2
    waves = sum(numel(slot.shape) for slot in op.outputs if slot.shape is not None) / ONE_WAVE_ELEMENTS
    return read / 2 * max(0.0, 1.0 - 1.0 / waves) if waves > 0 else 0.0


def written_base(op: MappedOp) -> list[Slot]:
    """The whole tensor an in-place operator wrote through a strided view of it (its ``self``).

    A decode step of MLA attention builds each layer's keys in one buffer, by two copies into
    slices of its last dimension, and attention reads the buffer whole: without it, those keys
    had no producer and their replay read them from memory, where the model found them in the
    cache.  The buffer's shape follows from the view's strides (row-major, each stride a multiple
    of the next); a view whose strides do not describe one (a broadcast) gives none."""
    if not op.inputs or not op.strides:
        return []
    slot, strides = op.inputs[0], op.strides[0]
    # the cheap tests first: only a strided first input needs the arguments parsed
    if slot.shape is None or strides is None or is_contiguous(slot.shape, strides):
        return []
    if not recorded_operator(op.arguments):  # written in place: the view's buffer is its output
        return []
    base = enclosing_shape(tuple(slot.shape), tuple(strides))
    return [] if base is None else [Slot(base, slot.dtype)]


def _conversion(op: MappedOp) -> str | None:
    """The dtype a ``Cast`` converts its input to (None for other operators).  A model converts a
    tensor to a dtype once and keeps the copy, so an output already converted to that dtype is
    no candidate for a second conversion: in a decode step Gemma's norm converts ``x``, the
    previous projection's ``[1,2304]`` output, and then its ``[2304]`` weight, which the element
    count alone paired with ``x`` again (replayed from the cache, 0.70x the model's time)."""
    if op.kernel_type != "Cast" or len(op.inputs) != 1 or len(op.outputs) != 1:
        return None
    return normalise_dtype(op.outputs[0].dtype)


def _is_operand(slot: Slot, out_shape: Shape | None) -> bool:
    return slot.shape is not None and broadcast_operand(tuple(slot.shape), out_shape)


def _passed_again(slot: Slot, strides: Shape | None, taken: Sequence[Written]) -> Written | None:
    """The tensor an earlier slot of a concatenation took, where this slot found no producer of
    its own and has that tensor's dtype and element count: one tensor concatenated with itself.
    Rotary embedding's ``cat((freqs, freqs), -1)`` reads the same table in both slots; counted
    as a parameter, its second slot was evicted before each repeat and the decode ``cat``
    replayed at 1.14-1.29x its in-model duration (four models, H200).  Only concatenations: of an
    element-wise operator's two inputs of one shape (a residual add), the second is as likely
    another tensor whose writer the inference missed."""
    if slot.shape is None or (strides is not None and not is_contiguous(slot.shape, strides)):
        return None
    dtype, count = normalise_dtype(slot.dtype), numel(slot.shape)
    return next((written for written in reversed(taken) if written.dtype == dtype and written.numel == count), None)


def _producer(
    slot: Slot, strides: Shape | None, out_shape: Shape | None, outputs: RecentOutputs, used: set[int], now: int | None
) -> tuple[Written | None, bool]:
    """The newest unused candidate (of its producer's outputs, one of the slot's shape first), and
    whether it was the only operator whose outputs could be this input."""
    if slot.shape is None:
        return None, False
    shape = tuple(slot.shape)
    candidates = outputs.candidates(normalise_dtype(slot.dtype), shape, strides, out_shape, now)
    chosen: Written | None = None
    for candidate in candidates:
        if candidate.serial in used:
            continue
        if chosen is not None and candidate.producer != chosen.producer:
            break
        if chosen is None or candidate.shape == shape:
            chosen = candidate
    if chosen is None:
        return None, False
    used.add(chosen.serial)
    return chosen, len({candidate.producer for candidate in candidates}) == 1


def _broadcast_target(op: MappedOp) -> Shape | None:
    """The output shape where the inputs broadcast to it (an element-wise operator), else None:
    an indexed tensor of ``[1,2048]`` read into ``[8,2048]`` rows is not broadcast."""
    if not op.outputs or op.outputs[0].shape is None:
        return None
    target: Shape | None = ()
    for slot in op.inputs:
        if slot.shape is not None and target is not None:
            target = broadcast(target, slot.shape)
    return op.outputs[0].shape if target is not None and tuple(target) == tuple(op.outputs[0].shape) else None
