"""Several placements of a case's inputs in device memory, cycled through its timed repeats.

A kernel that streams hundreds of MB runs at a speed that depends on where its operands lie in
device memory, not only on their shapes and values.  Measured on an H200 (torch 2.11, kernel
durations from the profiler, ``reproduce/wip/placement_effect.py``): a grouped GEMM of 2 rows
over experts of 4096 x 22016 took 148-161 us over six copies of its 16 KB activation (the values
equal), and 152 or 175 us in two processes on the same machine; a vocabulary GEMV (1 x 2560 by
103424) took 125-128 us on some copies of its weight and 139-142 us on others on one machine,
131.5-133.6 us on all six copies on another.  Idle, busy or spinning before the call, or a read
of twice the last-level cache, moved neither by more than 1 %; a write of it (dirty lines) moved
the GEMV by 7 % (what ``produced``'s dirty lines reproduce).

An in-model duration is one draw from that spread, and a replay on one placement another.
``--perf-input-placements N`` cycles the repeats of the modes with a step before every repeat
(``cold``, ``idle``, ``produced``) through N copies of the inputs: that step moves to the next
copy and, in ``produced``, rewrites its inputs, so the written average is the mean over
placements.  Over twelve models on an H200 (``benchmarks/model_coverage.py``, ``auto``), three
placements against one moved the kernel time within 10 % of the in-model durations by -2.6 to
+2.1 points per model, +0.2 on average, inside the replay's own run-to-run spread (up to 4
points): the default stays one placement, the inputs as built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from perf_plugin.replay.cache_modes import clone_inputs, tensors_in

DEFAULT_INPUT_PLACEMENTS = 1
# The copies beyond the first may take at most this share of the free device memory: a case
# whose inputs are too large for that is timed on fewer placements (one at the least).
PLACEMENT_MEMORY_SHARE = 0.25


def placement_count(wanted: int, input_bytes: int, free_bytes: int | None) -> int:
    """How many placements of inputs of ``input_bytes`` to time: ``wanted``, fewer where the copies
    would take more than ``PLACEMENT_MEMORY_SHARE`` of ``free_bytes``, one where that is unknown."""
    if wanted <= 1 or input_bytes <= 0 or free_bytes is None:
        return 1
    copies_allowed = int(free_bytes * PLACEMENT_MEMORY_SHARE) // input_bytes
    return max(1, min(wanted, 1 + copies_allowed))


def placed_copies(args: tuple[Any, ...], count: int) -> list[tuple[Any, ...]]:
    """``count`` input sets: ``args`` itself, then copies whose every tensor has a storage (an
    allocation) of its own, so that rewriting one set's inputs touches no other set's memory."""
    return [args] + [clone_inputs(args) for _ in range(count - 1)]


def matching_tensors(chosen: Sequence[Any], original: tuple[Any, ...], copy: tuple[Any, ...]) -> tuple[Any, ...]:
    """The tensors of ``copy`` (a copy of ``original`` with the same structure) at the positions
    where ``original`` holds a tensor viewing the storage of one of ``chosen``: the storage, as
    ``cache_modes.input_storages`` leaves inputs out, so that a view of a chosen tensor counts too."""
    storages = {tensor.untyped_storage().data_ptr() for tensor in tensors_in(tuple(chosen))}
    pairs = zip(tensors_in(original), tensors_in(copy), strict=True)
    return tuple(copied for tensor, copied in pairs if tensor.untyped_storage().data_ptr() in storages)


class PlacementCycle:
    """Input sets at distinct addresses: the step before each repeat moves to the next set and
    runs that set's own step; the call runs on the current set."""

    def __init__(self, input_sets: Sequence[tuple[Any, ...]]) -> None:
        if not input_sets:
            raise ValueError("a placement cycle needs at least one input set")
        self.input_sets = list(input_sets)
        self._index = 0

    def call(self, function: Callable[..., Any]) -> Callable[[], Any]:
        """``function`` on the current set's inputs."""

        def run_once() -> Any:
            return function(*self.input_sets[self._index])

        return run_once

    def steps(self, per_set: Sequence[Callable[[], Any] | None]) -> Callable[[], None]:
        """The step before every repeat: the next set, then its own step (``per_set``, one per set)."""
        if len(per_set) != len(self.input_sets):
            raise ValueError(f"{len(per_set)} steps for {len(self.input_sets)} input sets")

        def before_repeat() -> None:
            self._index = (self._index + 1) % len(self.input_sets)
            step = per_set[self._index]
            if step is not None:
                step()

        return before_repeat
