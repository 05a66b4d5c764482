"""In-process collector on torch.profiler (Kineto; CUPTI activity records on CUDA).

One profiler session spans a batch of cases; when the batch is full (or the process ends) the
profiler stops, the raw Kineto events are attributed to (case, repeat) pairs
(``perf_plugin.profiling.attribution``) and the results are handed over.

* On CUDA only device activity is recorded (kernels, memcpy, memset, from CUPTI): a tiny marker
  kernel (``torch.cuda._sleep``) before a case's first timed repeat and one after its last
  delimit the case, correlation ids (launch order) put its kernels in order, and the repeats are
  the equal runs of one kernel sequence in between.  Every profiled kernel costs the profiler
  tens of microseconds of host time, so one marker per repeat would nearly double a small
  case's cost; ``repeat_markers=True`` (``--perf-repeat-markers``) launches one before every repeat
  instead, for ops that launch a varying number of kernels per call.  Recording CPU operator
  events as well would cost several milliseconds per small case in the profiler's
  post-processing; measured on an H100 it cut the harness from ~570 to ~140 cases/s.
* On the CPU the operators themselves are the measurement, so CPU activity is recorded and a
  case's timed repeats run inside one labelled range, split afterwards into equal runs of one
  operator sequence.  A range per repeat (``--perf-repeat-markers``) doubles the events (0.77 instead
  of 0.54 ms per small case on a 2-core x86 host) and lengthens a small op's profiled time by
  3.5-4 %, the range's own work landing between the ops (``reproduce/repeat_delimiting_effect.py``;
  3.6-5.6 % in ten runs of this version).
  Collection is switched off outside the timed repeats (``toggle_collection_dynamic``): a
  case's input generation, verification and warm-up would otherwise record about twice the
  timed repeats' events, and reading events back is most of the profiler's cost (on a 2-core
  x86 host: 0.94 instead of 1.93 ms per small case, and the op durations 0.05 us (3 %) longer
  than with collection always on;
  ``reproduce/wip/collector_variants.py``).  CUDA keeps collection on for the whole batch:
  toggling works there on torch 2.11 (32 instead of ~47 events per small case, the same
  durations) but the toggles cost more than the events they save (5.4 against 2.3-3.2 ms per
  case on an H100).

Raw events are read directly (``kineto_results.events()``) rather than through
``profile.events()``, whose Python-side tree building would dominate the cost of small cases.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perf_plugin.profiling.attribution import (
    RANGE_PREFIX,
    SPAN_LABEL,
    CaseSpan,
    RawEvent,
    Segment,
    RepeatTiming,
    attribute_by_markers,
    attribute_cpu_ops,
)
from perf_plugin.results import OUTCOME_FAILED, OUTCOME_PASSED, CaseRef, CaseResult, KernelTime

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend


def _range_factory() -> Callable[[str], contextlib.AbstractContextManager[Any]]:
    import torch

    fast = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)
    if fast is not None:
        factory: Callable[[str], contextlib.AbstractContextManager[Any]] = fast
        return factory  # a C++ context manager: a few hundred ns instead of microseconds
    return torch.profiler.record_function


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Silence file descriptor 2 around profiler start/stop.

    Some torch builds have Kineto print a status line (``profiler_start``/``profiler_stop``) to
    the process's stderr on every session; with one session per batch that floods the terminal.
    Only these two calls are wrapped, so real errors elsewhere still reach stderr.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """No automatic cyclic garbage collection while a batch's events are read and attributed.

    Reading builds a named tuple per event (thousands per batch), all alive until attribution
    ends, so the collector's allocation counter fires generation after generation of
    collections that find nothing: these records form no cycles and are freed by reference
    counting when the flush returns.  In a pytest process on an H100 host (Python 3.12) the
    event reading that triggered them took ~1 ms per small case under cProfile, against ~0.1 ms
    in a bare loop (``docs/investigations.md``, "overhead_profile.py").
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass
class _Pending:
    number: int
    ref: CaseRef
    repeats: int


class TorchProfilerCollector:
    kind = "in-process"

    def __init__(self, backend: "Backend", batch_size: int = 32, repeat_markers: bool = False) -> None:
        self.backend = backend
        self.batch_size = batch_size
        self.repeat_markers = repeat_markers
        self._profiler: Any = None
        self._pending: list[_Pending] = []
        self._ready: list[CaseResult] = []
        self._counter = 0
        self._range = _range_factory()
        self._segments: list[Segment] = []
        self._span_repeats: dict[int, int] = {}  # CPU: case number -> repeats timed in one range
        self._marker: Callable[[], Any] | None = backend.marker()
        self._toggles = backend.collection_toggles  # collection only around the timed repeats
        from torch.profiler import ProfilerActivity

        self._activities = [getattr(ProfilerActivity, backend.profiler_activity)]

    # ------------------------------------------------------------------ profiler lifecycle

    def _ensure_started(self) -> None:
        if self._profiler is None:
            from torch.profiler import profile

            profiler: Any = profile(activities=self._activities, record_shapes=False, with_stack=False)
            try:
                with quiet_native_stderr(), warnings.catch_warnings():
                    # "Profiler clears events at the end of each cycle": intended, one session per batch
                    warnings.simplefilter("ignore", UserWarning)
                    profiler.__enter__()
            except BaseException:
                # Ctrl-C in the middle of the start: a session half started is no session to stop
                # later (torch: "Profiler must be initialized before stopping trace")
                with contextlib.suppress(Exception), quiet_native_stderr():
                    profiler.__exit__(None, None, None)
                raise
            self._profiler = profiler
            if self._toggles and not hasattr(self._profiler, "toggle_collection_dynamic"):
                self._toggles = False  # an older torch: everything is recorded, attribution is the same
            self._collect(False)

    def _collect(self, enable: bool) -> None:
        """Switch the recording of the session's activities on or off (toggling collectors only)."""
        if self._toggles and self._profiler is not None:
            # torch logs "Toggling CPU activity with GPU activity on may result in traces with GPU
            # events on arbitrary tracks" to fd 2 at every toggle, GPU or not: not for the user
            with quiet_native_stderr():
                self._profiler.toggle_collection_dynamic(enable, self._activities)

    def _stop(self) -> list[RawEvent]:
        if self._profiler is None:
            return []
        self.backend.synchronize()
        self._collect(True)  # what was recorded comes back whatever the state; stop as started
        profiler, self._profiler = self._profiler, None
        with quiet_native_stderr():
            profiler.__exit__(None, None, None)
        # on CUDA device activity only: runtime API records (CPU side) are not needed
        events = read_events(profiler.profiler.kineto_results.events(), device_only=self._marker is not None)
        del profiler
        return events

    # ------------------------------------------------------------------ Collector API
    def measure(
        self,
        ref: CaseRef,
        run_once: Callable[[], Any],
        repeats: int,
        before_repeat: Callable[[], Any] | None = None,
    ) -> None:
        self._ensure_started()
        self._counter += 1
        number = self._counter
        self._collect(True)
        try:
            if self._marker is None:
                self._run_in_ranges(number, run_once, repeats, before_repeat)
            else:
                self._run_between_markers(number, run_once, repeats, before_repeat)
        finally:
            self._collect(False)
        self._pending.append(_Pending(number, ref, repeats))

    def _run_between_markers(
        self, number: int, run_once: Callable[[], Any], repeats: int, before_repeat: Callable[[], Any] | None
    ) -> None:
        """CUDA: marker kernels delimit the case (or each repeat); ``segments`` says what follows each."""
        marker, segments = self._marker, self._segments
        assert marker is not None
        if before_repeat is None and not self.repeat_markers:
            marker()
            segments.append(CaseSpan(number, repeats))
            for _ in range(repeats):
                run_once()
            marker()
            segments.append(None)  # what follows (the next case's set-up) is not timed
            return
        for repeat in range(repeats):
            if before_repeat is not None:
                before_repeat()  # e.g. an L2 flush: after the previous end marker, so untimed
            marker()
            segments.append((number, repeat))
            run_once()
            if before_repeat is not None:
                marker()
                segments.append(None)
        if before_repeat is None:
            marker()
            segments.append(None)  # what follows (the next case's set-up) is not timed

    def _run_in_ranges(
        self, number: int, run_once: Callable[[], Any], repeats: int, before_repeat: Callable[[], Any] | None
    ) -> None:
        """CPU: the repeats inside one range labelled with the case number, or (``repeat_markers``,
        or work between repeats such as a cache flush) each inside its own range."""
        make_range = self._range
        prefix = f"{RANGE_PREFIX}{number}::"
        if before_repeat is None and not self.repeat_markers:
            # one range instead of one per repeat: half the events the profiler must process
            self._span_repeats[number] = repeats
            with make_range(f"{prefix}{SPAN_LABEL}"):
                for _ in range(repeats):
                    run_once()
            return
        for repeat in range(repeats):
            if before_repeat is not None:
                before_repeat()
            with make_range(f"{prefix}{repeat}"):
                run_once()

    def drain(self) -> list[CaseResult]:
        if len(self._pending) >= self.batch_size:
            self._flush()
        ready, self._ready = self._ready, []
        return ready

    def finish(self) -> list[CaseResult]:
        self._flush()
        ready, self._ready = self._ready, []
        return ready

    # ------------------------------------------------------------------ attribution
    def _flush(self) -> None:
        with _cyclic_gc_paused():
            self._flush_batch()

    def _flush_batch(self) -> None:
        timings: dict[tuple[int, int], RepeatTiming] = {}
        error: str | None = None
        case_errors: dict[int, str] = {}
        try:
            events = self._stop()
        except (RuntimeError, AssertionError) as exc:  # torch's profiler state broken, by an interrupt say
            events, error = [], f"the profiler session could not be stopped: {type(exc).__name__}: {exc}"
        if error is None and self._pending:
            if self._marker is not None:
                timings, error, case_errors = attribute_by_markers(events, self._segments)
            else:
                timings, error, case_errors = attribute_cpu_ops(events, self._span_repeats)
        self._segments, self._span_repeats = [], {}
        del events
        for pending in self._pending:
            self._ready.append(self._result(pending, {} if error else timings, error or case_errors.get(pending.number)))
        self._pending = []

    def _result(
        self, pending: _Pending, timings: dict[tuple[int, int], RepeatTiming], error: str | None = None
    ) -> CaseResult:
        ref = pending.ref
        samples: list[float] = []
        per_kernel: dict[str, list[int]] = {}
        for repeat in range(pending.repeats):
            timing = timings.get((pending.number, repeat))
            if timing is None or timing.total_ns <= 0:
                continue
            samples.append(timing.total_ns / 1000.0)
            for name, (total, count) in (timing.kernels or {}).items():
                entry = per_kernel.setdefault(name, [0, 0])
                entry[0] += total
                entry[1] += count
        backend = self.backend.name
        if not samples or error is not None:
            reason = error or "the profiler attributed no device time to this case's repeats"
            return CaseResult(ref, OUTCOME_FAILED, reason=reason, backend=backend)
        measured = len(samples)
        kernels = tuple(
            KernelTime(name, total / 1000.0 / measured, count / measured)
            for name, (total, count) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])
        )
        return CaseResult(ref, OUTCOME_PASSED, backend=backend, samples_us=tuple(samples), kernels=kernels)


def read_events(raw: Any, device_only: bool) -> list[RawEvent]:
    """Kineto events as RawEvents: every event, or only device activity (kernels, memcpy, memset)."""
    from torch._C._autograd import DeviceType

    cpu = DeviceType.CPU
    if device_only:
        return [_raw_event(e, True) for e in raw if e.device_type() != cpu]
    return [_raw_event(e, e.device_type() != cpu) for e in raw]


def _raw_event(event: Any, on_device: bool) -> RawEvent:
    name = event.name()
    return RawEvent(
        name,
        on_device,
        event.start_ns(),
        event.duration_ns(),
        event.correlation_id(),
        event.start_thread_id(),
        name.startswith(RANGE_PREFIX) or bool(event.is_user_annotation()),
    )
