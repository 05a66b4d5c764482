"""Which inputs of a replay the ``produced`` cache mode leaves out of the cache, from the row's
evidence of how the profiled model met them.

A row ingested from a trace with device activity says, per input slot, how many bytes the device
moved between the input's write and the kernel reading it (``Profiling Input Reuse Distance(B)``,
``perf_plugin.ingest.input_reuse``).  An input written less than a cache's size ago was still in
the cache; one written longer ago, or never written by a kernel of the trace (a parameter), was
read from memory.  ``produced`` rewrites the first kind before every repeat and leaves the second
evicted.  On an H100 the difference is ~0.3 us for a decode-sized element-wise kernel: one input
read from memory costs the kernel a memory round trip that a cached one does not.

The slots name shapes and dtypes, the replay's inputs are tensors: each cold slot claims the
first not yet claimed tensor of its shape and dtype among the inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.reuse_cell import parse_reuse_cell
from perf_plugin.database.schema import PROFILING_INPUT_REUSE
from perf_plugin.replay.cache_modes import tensors_in
from perf_plugin.replay.tensors import KernelRow, TensorSpec


# The share of the cache a written input survives in: traffic of half the last-level cache since
# the write evicts it.  An H100's L2 (50 MB) is two partitions, and a line the SMs of both halves
# read is held in each, so a working set fills it at about half its size.
CACHED_SHARE = 0.5


def has_reuse_evidence(row: KernelRow) -> bool:
    return bool(row.attrs.get(PROFILING_INPUT_REUSE, "").strip())


def cold_slots(row: KernelRow, cache_bytes: int) -> list[TensorSpec]:
    """The input slots the profiled kernel read from memory (none where the row has no evidence).

    Raises DatabaseError naming the column on a bad cell."""
    try:
        distances = parse_reuse_cell(row.attrs.get(PROFILING_INPUT_REUSE, ""))
    except DatabaseError as exc:
        raise exc.located(column=PROFILING_INPUT_REUSE) from None
    return [
        spec
        for spec, distance in zip(row.inputs, distances)
        if spec.present and distance >= cache_bytes * CACHED_SHARE
    ]


def cold_inputs(row: KernelRow, args: Sequence[Any], cache_bytes: int) -> tuple[Any, ...]:
    """The tensors among ``args`` (what ``make_inputs`` built) of the row's cold slots."""
    tensors = tensors_in(args)
    claimed: set[int] = set()
    cold = []
    for spec in cold_slots(row, cache_bytes):
        for index, tensor in enumerate(tensors):
            if index not in claimed and _matches(tensor, spec):
                claimed.add(index)
                cold.append(tensor)
                break
    return tuple(cold)


def _matches(tensor: Any, spec: TensorSpec) -> bool:
    return tuple(tensor.shape) == tuple(spec.shape or ()) and tensor.dtype == spec.torch_dtype()

