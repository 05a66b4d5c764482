"""Runs one case: build inputs, verify once against the reference, warm up, time the repeats.

Failures are classified for the test: ``CaseSkip`` (the case cannot run here, e.g. its tensors
exceed free device memory) and ``CaseFailure`` (the replay ran and was wrong, or raised).  Inputs
and outputs are released before returning, whatever happens, so memory stays flat over long runs.
"""

from __future__ import annotations

import functools
import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.replay.base import CaseBuildError, compute_reference, host_reference, reference_on_device
from perf_plugin.replay.rank_group import RankGroup, group_scope
from perf_plugin.replay.cache_modes import (
    FALLBACK_CACHE_BYTES,
    MAX_ROTATION_COPIES,
    cache_evict,
    cache_flush,
    produce_inputs,
    replicate_inputs,
    rotating,
    row_cache_mode,
    rotation_plan,
    tensor_bytes,
)
from perf_plugin.replay.code_eviction import CodeCache, code_cache_state, code_eviction, in_order
from perf_plugin.replay.dirty_lines import dirty_bytes, dirty_lines
from perf_plugin.replay.cold_inputs import CacheSplit, has_reuse_evidence
from perf_plugin.replay.repeat_mix import in_proportion
from perf_plugin.replay.op_mapping import resolve_replay
from perf_plugin.replay.placements import (
    DEFAULT_INPUT_PLACEMENTS,
    PlacementCycle,
    placed_copies,
    placement_count,
)
from perf_plugin.replay.verify import VerificationError, compare_bytes, verify_outputs
from perf_plugin.run.case_outcomes import CaseFailure, CaseSkip, bad_cells_fail
from perf_plugin.run.launcher import case_launcher

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from perf_plugin.backends.base import Backend
    from perf_plugin.candidates.tester import CandidateJudge
    from perf_plugin.profiling.collector import Collector
    from perf_plugin.replay.base import OpReplay
    from perf_plugin.replay.tensors import KernelRow
    from perf_plugin.run.cases import Case

# Device memory a case may use, as a multiple of its row's input+output bytes: the op's own
# outputs during verification and timing, plus temporaries inside composite ops.  A reference
# computed on the device (GEMMs on CUDA) is counted on top of this (``_reference_bytes``).
MEMORY_HEADROOM = 3.0
# A case needing less than this share of the free memory seen at the last query is not checked
# again: querying costs ~50 us per case on CUDA (cudaMemGetInfo), memory is released after
# every case, and an out-of-memory error in a case is still caught and reported as a skip.
SMALL_CASE_SHARE = 0.05
RELEASE_CACHE_BYTES = 64 * 1024 * 1024
# The cache modes with a step before every repeat, which begins with the code eviction
EVICTING_MODES = ("cold", "idle", "produced")


@dataclass
class ReplayRunner:
    backend: "Backend"
    collector: "Collector"
    repeat_count: int
    warmup_count: int
    seed: int = 0
    cache_mode: str = "warm"  # an effective mode (cache_modes.effective_cache_mode), never "auto"
    # ``auto`` where the backend replays profiled rows in ``produced`` (Backend.auto_produced_from_us)
    produced_from_us: float | None = None
    rotate_max_copies: int = MAX_ROTATION_COPIES
    # cold, idle and produced: repeats cycle through this many placements of the inputs (``placements``)
    input_placements: int = DEFAULT_INPUT_PLACEMENTS
    # --perf-candidate: judges the row's candidate on the same inputs after the reference is timed
    candidate_judge: "CandidateJudge | None" = None
    # The process group of a given size that a collective row runs in (an expert-parallel
    # session's ranks: perf_plugin.run.expert_parallel.ExpertGroups); None: this process forms none.
    groups: "Callable[[int], RankGroup] | None" = None
    _flush_buffer: Any = None
    _evict_code: Any = None
    _cache_bytes: int | None = None
    _free_seen: int | None = None
    _device_type: str | None = None

    def _reference_bytes(self, row: "KernelRow", replay: "OpReplay | None") -> int:
        """Device bytes the row's float64 reference and its comparison hold where the replay
        computes it on this device (``OpReplay.reference_on_device``), else 0: a host reference
        takes no device memory."""
        if replay is None:
            return 0
        if self._device_type is None:
            self._device_type = self.backend.torch_device().type
        if not reference_on_device(replay.reference_on_device, self._device_type):
            return 0
        return replay.reference_bytes(row) + compare_bytes(max((spec.numel for spec in row.outputs), default=0))

    def _check_memory(self, case: "Case", replay: "OpReplay | None" = None) -> bool:
        """Skip the case (CaseSkip) when its tensors, with headroom, exceed the free device memory.
        True when the float64 reference of a replay that computes it on the device fits beside
        them too; False: the reference goes to the host (slow, but the row is still measured).
        The reference is counted on top of the headroom, which covers the op's own outputs and
        temporaries: a float64 GEMM reference is 4x (bf16) to 8x (fp8 operands) the row's bytes."""
        assert case.row is not None
        need = int(case.row.nbytes * MEMORY_HEADROOM)
        reference = self._reference_bytes(case.row, replay)
        if self._free_seen is not None and need + reference < self._free_seen * SMALL_CASE_SHARE:
            return True
        free = self._free_seen = self.backend.free_memory_bytes()
        if free is not None and need > free:
            error = DatabaseError(
                f"tensors need about {need / 2**30:.2f} GiB with headroom, "
                f"{free / 2**30:.2f} GiB free on {self.backend.name}",
                path=case.ref.csv_file,
                row=case.ref.row_line,
                column="Input Shapes",
            )
            raise CaseSkip(error.describe())
        return free is None or need + reference <= free

    def _last_level_cache(self) -> int:
        if self._cache_bytes is None:
            self._cache_bytes = self.backend.cache_bytes() or FALLBACK_CACHE_BYTES
        return self._cache_bytes

    def _buffer(self) -> Any:
        """Twice the cache (a pass over exactly its size may leave lines behind), built once."""
        if self._flush_buffer is None:
            import torch

            size = 2 * self._last_level_cache()
            self._flush_buffer = torch.zeros(size, dtype=torch.uint8, device=self.backend.torch_device())
        return self._flush_buffer

    def _flush(self) -> Any:
        """A call overwriting twice the cache."""
        return cache_flush(self._buffer())

    def _evict(self) -> Any:
        """A call reading twice the cache."""
        return cache_evict(self._buffer())

    def _code_eviction(self) -> Any:
        """A call launching distinct kernels over the whole device (``code_eviction``), built once."""
        if self._evict_code is None:
            self._evict_code = code_eviction(self.backend.torch_device(), self.backend.code_eviction_shape)
        return self._evict_code

    def _before_repeat(
        self,
        args: tuple[Any, ...],
        mode: str,
        split: CacheSplit = CacheSplit(),
        code: CodeCache = CodeCache.MEMORY,
        fetch_code: "Callable[[], Any] | None" = None,
        dirty: int = 0,
    ) -> Any:
        """What runs outside the timed range before every repeat: the flush (cold mode), the
        eviction (idle mode), or the eviction and a rewrite of the inputs ``args`` as ``split``
        says (produced mode: a model reads its weights, and inputs written long before, from
        memory, and part of an input written over a long stretch: ``_cache_split``).  The kernels' code is left where the
        row's model found it (``_code_state``, ``code_eviction``): in memory, the instruction
        caches are evicted first, so that the data eviction leaves none of their lines dirty; in
        the last-level cache, ``fetch_code`` (the kernel on other inputs) runs after the data
        eviction and the instruction caches are evicted after it; in the instruction caches,
        nothing is evicted but the data.  In produced mode ``dirty`` bytes are written before the
        rewrite, as many dirty lines as the row's model left (``dirty_lines``)."""
        if mode not in EVICTING_MODES:
            return None
        evict = self._flush() if mode == "cold" else self._evict()
        if code is CodeCache.MEMORY:
            evict = in_order(self._code_eviction(), evict)
        elif code is CodeCache.LAST_LEVEL:
            evict = in_order(evict, fetch_code, self._code_eviction())
        if mode == "produced":
            evict = in_order(evict, dirty_lines(self._buffer(), dirty))
            return produce_inputs(evict, split.rewritten(args), split.evicted_storages())
        return evict

    def _code_state(self, case: "Case", mode: str) -> CodeCache:
        """Where the row's profile shows the model found its kernels' code (read only for the
        modes that would evict it, so a bad cell fails no case timed warm)."""
        assert case.row is not None
        if mode not in EVICTING_MODES:
            return CodeCache.INSTRUCTION
        with bad_cells_fail(case):
            return code_cache_state(case.row, self._last_level_cache())

    def _fetch_inputs(self, replay: "OpReplay", row: "KernelRow", seed: int, code: CodeCache) -> tuple[Any, ...] | None:
        """For a row whose code the model found in the last-level cache, inputs of its own
        (another seed's) for the call that brings the code there; None for the others."""
        if code is not CodeCache.LAST_LEVEL:
            return None
        try:
            return replay.make_inputs(row, self.backend.torch_device(), self.backend.generator(seed + 1))
        except RuntimeError as exc:
            if "out of memory" in str(exc).lower():
                raise CaseSkip("out of device memory for the inputs of the call that fetches the code") from None
            raise

    def _placements(self, args: tuple[Any, ...], call_args: tuple[Any, ...], mode: str) -> PlacementCycle | None:
        """Copies of the inputs for the repeats to cycle through (``placements``), or None: one
        placement (a mode without a step per repeat, an API call bound to its inputs, no room)."""
        if mode not in EVICTING_MODES or call_args is not args or self.input_placements <= 1:
            return None
        count = placement_count(self.input_placements, tensor_bytes(args), self.backend.free_memory_bytes())
        try:
            return PlacementCycle(placed_copies(args, count)) if count > 1 else None
        except RuntimeError as exc:
            if "out of memory" in str(exc).lower():
                return None  # the one placement the inputs have
            raise

    def _repeat_steps(
        self,
        case: "Case",
        replay: "OpReplay",
        args: tuple[Any, ...],
        mode: str,
        seed: int,
        cycle: PlacementCycle | None = None,
    ) -> tuple[Any, Callable[[Callable[..., Any]], Any]]:
        """The step before every repeat of the case's kernel (``_before_repeat``, per state the
        row's calls found their inputs in, in proportion: ``_cache_splits``; with ``cycle``, the
        next placement's), and a maker of the same step for another function of the replay's
        inputs (a candidate), whose own code the step fetches where the row's is fetched."""
        assert case.row is not None
        splits = self._cache_splits(case, replay, args, mode)
        code = self._code_state(case, mode)
        fetch_inputs = self._fetch_inputs(replay, case.row, seed, code)
        fetch = None if fetch_inputs is None else _bind(*case_launcher(self.backend, replay, case.row, fetch_inputs))

        def mixed(inputs: tuple[Any, ...], splits_of: Sequence[tuple[CacheSplit, float]], fetch_code: Any) -> Any:
            return in_proportion([
                (self._before_repeat(inputs, mode, split, code, fetch_code, self._dirty_bytes(case, inputs, split, mode)),
                 calls) for split, calls in splits_of
            ])

        def steps_for(function: Callable[..., Any]) -> Any:
            return mixed(args, splits, None if fetch_inputs is None else _bind(function, fetch_inputs))

        if cycle is None:
            return mixed(args, splits, fetch), steps_for
        per_set = [mixed(copy, [(split.for_copy(args, copy), calls) for split, calls in splits], fetch)
                   for copy in cycle.input_sets]
        return cycle.steps(per_set), steps_for

    def _dirty_bytes(self, case: "Case", args: tuple[Any, ...], split: CacheSplit, mode: str) -> int:
        """The bytes produced mode leaves dirty before the rewrite of the inputs (``dirty_lines``)."""
        assert case.row is not None
        if mode != "produced":
            return 0
        rewritten = sum(storage.numel() for storage in split.rewritten(args))
        with bad_cells_fail(case):
            return dirty_bytes(case.row, self._last_level_cache(), rewritten)

    def _cache_splits(
        self, case: "Case", replay: "OpReplay", args: tuple[Any, ...], mode: str
    ) -> list[tuple[CacheSplit, float]]:
        """What ``produced`` leaves out of the cache, per state the row's calls found their
        inputs in, with its share of the calls: the model's parameters, the inputs the row's
        profile shows were read from memory, and the part of others it shows was (``cold_inputs``)."""
        assert case.row is not None
        if mode != "produced":
            return [(CacheSplit(), 1.0)]
        with bad_cells_fail(case):
            return CacheSplit.mixture(case.row, args, self._last_level_cache(), replay.parameters(case.row, args))

    def _timed_call(self, function: Any, args: tuple[Any, ...], mode: str) -> Any:
        """The call the warm-up and repeats run: on the same inputs, on rotating copies (rotate),
        or launched once the device is idle (idle: the wait is on the host, so the timed range
        holds no work but the call's)."""
        if mode == "idle":
            return _after_idle(self.backend.synchronize, function, args)
        if mode != "rotate":
            return _bind(function, args)
        calls = self.warmup_count + self.repeat_count
        count, flush_once = rotation_plan(tensor_bytes(args), self._last_level_cache(), calls, self.rotate_max_copies)
        if count == 1:
            return _bind(function, args)
        input_sets = replicate_inputs(args, count)
        if flush_once:
            self._flush()()
        return rotating(function, input_sets)

    def _group(self, case: "Case") -> RankGroup | None:
        """The process group a collective row runs in (None for a row of one rank)."""
        if case.group_size == 1:
            return None
        if self.groups is None:
            raise CaseSkip(f"the row runs over a process group of {case.group_size} ranks, which this process has none of")
        try:
            return self.groups(case.group_size)
        except (ValueError, RuntimeError) as exc:
            raise CaseFailure(f"the process group of {case.group_size} ranks cannot be made: {exc}") from None

    def run(self, case: "Case") -> None:
        assert case.row is not None
        replay = resolve_replay(case.replay_kernel_type or case.ref.kernel_type)
        if replay is None:
            raise CaseSkip(f"no replay for kernel type {case.ref.kernel_type}")
        device_reference = self._check_memory(case, replay)
        group = self._group(case)
        # a reference that would not fit on the device is computed on the host, the candidate
        # judge's included
        with group_scope(group), host_reference(not device_reference):
            # each rank its own tokens and experts, as the ranks of a model have
            self._run(case, replay, self.seed + (group.rank if group is not None else 0))

    def _run(self, case: "Case", replay: "OpReplay", seed: int) -> None:
        assert case.row is not None
        mode = row_cache_mode(self.cache_mode, case.profiled_us, self.produced_from_us, has_reuse_evidence(case.row))
        device = self.backend.torch_device()
        args: tuple[Any, ...] = ()
        try:
            generator = self.backend.generator(seed)
            try:
                args = replay.make_inputs(case.row, device, generator)
                function, call_args = case_launcher(self.backend, replay, case.row, args)
                outputs = function(*call_args)
                self.backend.synchronize()
            except CaseBuildError as exc:
                raise CaseFailure(f"replay cannot be built: {exc}") from None
            except RuntimeError as exc:
                if "out of memory" in str(exc).lower():
                    raise CaseSkip(f"out of device memory: {str(exc).splitlines()[0]}") from None
                raise CaseFailure(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
            reference = compute_reference(replay, args)
            try:
                verify_outputs(replay, case.row, outputs, reference, args)
            except VerificationError as exc:
                raise CaseFailure(str(exc)) from None
            del outputs, reference
            try:
                run_once = self._timed_call(function, call_args, mode)
            except RuntimeError as exc:
                if "out of memory" in str(exc).lower():
                    raise CaseSkip(f"out of device memory for the {mode} cache mode") from None
                raise
            for _ in range(self.warmup_count):
                run_once()
            cycle = self._placements(args, call_args, mode)
            if cycle is not None:
                run_once = self._timed_call(cycle.call(function), (), mode)
            before_repeat, steps_for = self._repeat_steps(case, replay, args, mode, seed, cycle)
            self.collector.measure(case.ref, run_once, self.repeat_count, before_repeat)
            del run_once, function, call_args, before_repeat, cycle  # releases copies of the inputs with the inputs
            if self.candidate_judge is not None:
                self.candidate_judge.judge(
                    case, replay, args, functools.partial(self._timed_call, mode=mode), steps_for
                )
        finally:
            del args
            # a reference computed on the device leaves its float64 blocks in the allocator's cache
            self._release(case.row.nbytes + self._reference_bytes(case.row, replay))

    def _release(self, case_bytes: int) -> None:
        # Inputs and outputs are freed by reference counting when ``args`` goes out of scope;
        # collecting garbage costs ~0.6 ms, so it is done only where it matters.
        if case_bytes >= RELEASE_CACHE_BYTES:
            gc.collect(0)
            # The caching allocator keeps freed blocks; after a large case, return them so one
            # huge case does not pin memory for the rest of a long run.  Small cases skip this:
            # freeing cached blocks synchronises the device and would slow small-kernel runs.
            self.backend.empty_cache()


def _bind(function: Any, args: tuple[Any, ...]) -> Any:
    def run_once() -> Any:
        return function(*args)

    return run_once


def _after_idle(synchronize: Any, function: Any, args: tuple[Any, ...]) -> Any:
    def run_once() -> Any:
        synchronize()
        return function(*args)

    return run_once

