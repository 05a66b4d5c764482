"""When the tensors a traced operator wrote were released, from the allocator's events.

A profile taken with ``profile_memory=True`` records every block an allocator hands out and
takes back (``[memory]`` events: time, address, size).  A tensor released before an operator
started cannot be one of its inputs, which settles what shapes and dtypes alone cannot: in a
decode step many tensors share the residual stream's shape ``[1,1,hidden]`` (a norm's output,
a projection's input and output, a quantized copy), and of those the only ones still alive at
the residual add are the residual and the sublayer's output (``perf_plugin.ingest.input_reuse``).

An operator's outputs are the blocks allocated on its thread while it ran and not released
before it returned (a temporary of a composite operator is), matched to its output slots by
size in slot order: the caching allocator of CUDA rounds a request up to a multiple of
``CUDA_BLOCK_BYTES``, the CPU's allocator records the request.  An output without a matching
block (an in-place operator's, a view's, a profile without memory events) has no known release.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from perf_plugin.ingest.input_reuse import slot_bytes
from perf_plugin.trace.events import MemoryEvent, TraceOp
from perf_plugin.trace.mapped import MappedOp

CUDA_BLOCK_BYTES = 512
_CPU = 0


@dataclass(frozen=True)
class _Block:
    thread: tuple[int, int]
    allocated_ns: int
    size: int
    device_type: int
    released_ns: int | None  # None: still held when the profile ended


def _blocks(memory: Sequence[MemoryEvent]) -> list[_Block]:
    """Each allocation paired with the release of its address that follows it, by allocation time."""
    ordered = sorted(memory, key=lambda event: event.time_ns)
    held: dict[tuple[int, int], int] = {}  # (device type, address) -> index of its open allocation
    allocations: list[MemoryEvent] = []
    released: list[int | None] = []
    for event in ordered:
        key = (event.device_type, event.address)
        if event.size > 0:
            held[key] = len(allocations)
            allocations.append(event)
            released.append(None)
        elif key in held:
            released[held.pop(key)] = event.time_ns
    return [
        _Block(event.thread, event.time_ns, event.size, event.device_type, end)
        for event, end in zip(allocations, released)
    ]


def _fits(block: _Block, wanted: int) -> bool:
    if block.device_type == _CPU:
        return block.size == wanted
    rounded = -(-wanted // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
    return block.size in (wanted, rounded)


def _output_of(block: _Block, op: TraceOp) -> bool:
    """Allocated on the operator's thread while it ran (``release_times`` looks only there), and
    not released before it returned."""
    return block.thread == op.thread and (block.released_ns is None or block.released_ns > op.end_ns)


def release_times(ops: Sequence[tuple[TraceOp, MappedOp]], memory: Sequence[MemoryEvent]) -> list[tuple[int | None, ...]]:
    """Per operator, per output slot, when its block was released (None: unknown, or held to the
    end of the profile; either way it may be read by any later operator)."""
    blocks = _blocks(memory)
    starts = [block.allocated_ns for block in blocks]
    result: list[tuple[int | None, ...]] = []
    for op, mapped in ops:
        first, last = bisect.bisect_left(starts, op.start_ns), bisect.bisect_right(starts, op.end_ns)
        kept = [index for index in range(first, last) if _output_of(blocks[index], op)]
        per_slot: list[int | None] = []
        for slot in mapped.outputs:
            wanted = slot_bytes(slot)
            index = next((i for i in kept if wanted and _fits(blocks[i], wanted)), None)
            if index is None:
                per_slot.append(None)
                continue
            kept.remove(index)  # a block is one output
            per_slot.append(blocks[index].released_ns)
        result.append(tuple(per_slot))
    return result
