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


# The share of the cache a written input survives in: traffic of 0.8 of the last-level cache
# since the write evicts it.  Measured on an H200 (60 MB of L2), over twelve models' rows replayed
# with the evidence (benchmarks/model_coverage.py): rows whose input lay 0.1 to 0.5 of the cache
# away replayed at a median 0.99-1.00 of their in-model time with it cached, those 0.5 to 0.8
# away at 1.10-1.16 read from memory (half of them over 1.1: the model still found them), those
# 0.8 to 1.0 away at 1.01-1.02 read from memory; in isolation (reproduce/wip/reuse_distance_effect.py)
# small inputs stayed cached through 32-40 MB of traffic and were read from memory from 48 MB.
# Half the cache, the former share, was reasoned from the L2's two partitions (a line the SMs of
# both halves read is held in each), which a kernel's code is (code_eviction.py) and a decode
# activation, read by a few SMs, is not.
CACHED_SHARE = 0.8


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

