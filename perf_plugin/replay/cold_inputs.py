"""Which inputs of a replay the ``produced`` cache mode leaves out of the cache, from the row's
evidence of how the profiled model met them.

A row ingested from a trace with device activity says, per input slot, how many bytes the device
moved between the input's write and the kernel reading it (``Profiling Input Reuse Distance(B)``,
``perf_plugin.ingest.input_reuse``).  An input written less than a cache's size ago was still in
the cache; one written longer ago, or never written by a kernel of the trace (a parameter), was
read from memory.  ``produced`` rewrites the first kind before every repeat and leaves the second
evicted.  On an H100 the difference is ~0.3 us for a decode-sized element-wise kernel: one input
read from memory costs the kernel a memory round trip that a cached one does not.

Where the row also says over how many bytes an input's bytes were last used (``Profiling Input
Reuse Spread(B)``: they lie that far either side of its distance), the share of the input that
range puts within the cache is cached and the rest is not: ``produced`` rewrites that share of
it, its tail (a producer's last writes), and leaves the rest evicted.

A row's calls need not have found their inputs alike: a decode layer's first rotary ``mul`` reads
its ``cos`` table from memory, the next three find it cached.  Replayed in the median call's state
every repeat is the cheap one.  Where the row has its calls' eighths (``Profiling Input Reuse
Calls(B)``), ``CacheSplit.mixture`` gives a split per state with its share of the calls, and the
runner takes them in proportion over the repeats (``perf_plugin.replay.repeat_mix``): that row of
four models went from 0.822-0.932 of its in-model time to 0.878-0.983 (H200, docs/coverage.md).

The slots name shapes and dtypes, the replay's inputs are tensors: each slot, in order, claims
the first not yet claimed tensor of its shape and dtype among the inputs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.reuse_calls_cell import EIGHTHS, parse_reuse_calls_cell
from perf_plugin.database.reuse_cell import parse_reuse_cell
from perf_plugin.database.schema import (
    PROFILING_INPUT_BLOCK_REUSE,
    PROFILING_INPUT_REUSE,
    PROFILING_INPUT_REUSE_CALLS,
    PROFILING_INPUT_REUSE_SPREAD,
)
from perf_plugin.replay.cache_modes import input_storages, tensors_in
from perf_plugin.replay.placements import matching_tensors
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


def cached_shares(row: KernelRow, cache_bytes: int) -> tuple[float, ...]:
    """Per input slot of the row's cell, the share of the input the profiled kernel found in the
    cache: 1 or 0 by its distance (0 for an input no kernel of the trace wrote), or between where
    its spread straddles ``CACHED_SHARE`` of the cache; () where the row has no cell.

    Raises DatabaseError naming the column on a bad cell."""
    distances = _cell(row, PROFILING_INPUT_REUSE, parse_reuse_cell)
    return _shares(distances, _spreads(row, len(distances)), cache_bytes * CACHED_SHARE)


def call_states(row: KernelRow, cache_bytes: int) -> list[tuple[tuple[float, ...], float]]:
    """The states the row's calls found their inputs in, each as ``cached_shares`` gives it and
    with the share of calls in it: from the eighths of its calls where the row has them
    (``Profiling Input Reuse Calls(B)``), else its median's state for every call.

    Raises DatabaseError naming the column on a bad cell."""
    distances = _cell(row, PROFILING_INPUT_REUSE, parse_reuse_cell)
    spreads = _spreads(row, len(distances))
    kept = cache_bytes * CACHED_SHARE
    eighths = _cell(row, PROFILING_INPUT_REUSE_CALLS, parse_reuse_calls_cell)
    if len(eighths) != len(distances) or not distances:  # no cell, or one of another layout
        return [(_shares(distances, spreads, kept), 1.0)]
    states = Counter(_shares([slot[k] for slot in eighths], spreads, kept) for k in range(EIGHTHS))
    return [(shares, calls / EIGHTHS) for shares, calls in states.items()]


def _shares(distances: Sequence[float], spreads: Sequence[float], kept: float) -> tuple[float, ...]:
    return tuple(_share_within(distance, spread, kept) for distance, spread in zip(distances, spreads))


def _spreads(row: KernelRow, slots: int) -> tuple[float, ...]:
    spreads = _cell(row, PROFILING_INPUT_REUSE_SPREAD, parse_reuse_cell)
    return spreads if len(spreads) == slots else (0.0,) * slots  # an older row, or another layout: no ranges


def _share_within(distance: float, spread: float, kept: float) -> float:
    if math.isinf(distance):
        return 0.0
    if not 0 < spread < math.inf:
        return 1.0 if distance < kept else 0.0
    nearest = distance - spread
    return min(1.0, max(0.0, (kept - nearest) / (2 * spread)))


def _cell(row: KernelRow, column: str, parse: Callable[[str], tuple[Any, ...]]) -> tuple[Any, ...]:
    try:
        return parse(row.attrs.get(column, ""))
    except DatabaseError as exc:
        raise exc.located(column=column) from None


def input_shares(row: KernelRow, args: Sequence[Any], slot_shares: Sequence[float]) -> list[tuple[Any, float]]:
    """The tensors among ``args`` (what ``make_inputs`` built) of the row's slots with evidence,
    each with the share of it the model found cached (``slot_shares``: ``cached_shares``)."""
    tensors = tensors_in(args)
    claimed: set[int] = set()
    shares = []
    for spec, share in zip(row.inputs, slot_shares):
        if not spec.present:
            continue
        for index, tensor in enumerate(tensors):
            if index not in claimed and _matches(tensor, spec):
                claimed.add(index)
                shares.append((tensor, share))
                break
    return shares


def cold_inputs(row: KernelRow, args: Sequence[Any], cache_bytes: int) -> tuple[Any, ...]:
    """The tensors among ``args`` of the row's slots the profiled kernel read from memory."""
    return tuple(tensor for tensor, share in input_shares(row, args, cached_shares(row, cache_bytes)) if share <= 0)


@dataclass(frozen=True)
class CacheSplit:
    """What ``produced`` leaves out of its rewrite: ``uncached`` tensors wholly, and of each of
    ``partial`` all but its last ``share`` of bytes."""

    uncached: tuple[Any, ...] = ()
    partial: tuple[tuple[Any, float], ...] = ()
    # inputs their producers wrote into lines out of the cache (``evicted_writes``)
    written_evicted: tuple[Any, ...] = ()

    @staticmethod
    def of(row: KernelRow, args: Sequence[Any], cache_bytes: int, parameters: Sequence[Any]) -> "CacheSplit":
        """The split of a row's inputs as its median call found them (``cached_shares``)."""
        evicted = evicted_writes(row, args, cache_bytes)
        return CacheSplit.with_shares(row, args, cached_shares(row, cache_bytes), parameters, evicted)

    @staticmethod
    def mixture(row: KernelRow, args: Sequence[Any], cache_bytes: int,
                parameters: Sequence[Any]) -> list[tuple["CacheSplit", float]]:
        """A split per state the row's calls found their inputs in, with its share of the calls
        (``call_states``)."""
        evicted = evicted_writes(row, args, cache_bytes)
        return [(CacheSplit.with_shares(row, args, shares, parameters, evicted), calls)
                for shares, calls in call_states(row, cache_bytes)]

    @staticmethod
    def with_shares(row: KernelRow, args: Sequence[Any], slot_shares: Sequence[float],
                    parameters: Sequence[Any], written_evicted: tuple[Any, ...] = ()) -> "CacheSplit":
        """The split of a row's inputs: the model's ``parameters`` and the inputs of no share
        cached uncached, those of a share between partial (``slot_shares``, per slot)."""
        shares = input_shares(row, args, slot_shares)
        skipped = {id(tensor) for tensor in parameters}
        cold = tuple(tensor for tensor, share in shares if share <= 0 and id(tensor) not in skipped)
        partial = tuple((t, share) for t, share in shares if 0 < share < 1 and id(t) not in skipped)
        return CacheSplit((*parameters, *cold), partial, written_evicted)

    def evicted_storages(self) -> list[Any]:
        """The storages of ``written_evicted`` (flat byte tensors, as ``rewritten``'s)."""
        return input_storages(self.written_evicted)

    def rewritten(self, args: tuple[Any, ...]) -> list[Any]:
        """The flat byte tensors ``produced`` rewrites: the storages of ``args`` but the uncached
        and partial ones, and the tail of each partial one's storage."""
        whole = input_storages(args, exclude=(*self.uncached, *(tensor for tensor, _ in self.partial)))
        tails = []
        for tensor, share in self.partial:
            for storage in input_storages(tensor):
                kept = int(storage.numel() * share)
                tails += [storage[storage.numel() - kept:]] if kept else []
        return whole + tails

    def for_copy(self, args: tuple[Any, ...], copy: tuple[Any, ...]) -> "CacheSplit":
        """The same split of ``copy``, a copy of ``args`` (``placements``)."""
        partial = tuple((c, share) for t, share in self.partial for c in matching_tensors((t,), args, copy))
        evicted = matching_tensors(self.written_evicted, args, copy)
        return CacheSplit(matching_tensors(self.uncached, args, copy), partial, evicted)


def evicted_writes(row: KernelRow, args: Sequence[Any], cache_bytes: int) -> tuple[Any, ...]:
    """The tensors among ``args`` of the row's slots whose memory the model had not used for
    ``CACHED_SHARE`` of the cache when their producer wrote them (``Profiling Input Block Reuse
    Distance(B)``; a slot it does not know is not one): their lines were out of the cache then.

    Raises DatabaseError naming the column on a bad cell."""
    blocks = _cell(row, PROFILING_INPUT_BLOCK_REUSE, parse_reuse_cell)
    kept = cache_bytes * CACHED_SHARE
    flags = [1.0 if math.isfinite(distance) and distance >= kept else 0.0 for distance in blocks]
    return tuple(tensor for tensor, flag in input_shares(row, args, flags) if flag)


def _matches(tensor: Any, spec: TensorSpec) -> bool:
    return tuple(tensor.shape) == tuple(spec.shape or ()) and tensor.dtype == spec.torch_dtype()
