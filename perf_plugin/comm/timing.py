"""Per-iteration durations of a collective on this rank, in microseconds.

``kernel`` mode (the default) measures the collective itself, not its launch:

* CUDA: the calls run back to back inside ``torch.profiler`` (CUDA activity only, no host
  synchronisation inside the loop); each iteration's duration is the device time of the NCCL
  kernels it launched (kernel names containing ``nccl``).  A one-rank group launches no NCCL
  kernel: its device copy is timed instead, and a one-rank all_reduce, which does nothing on
  the device, is skipped.  For groups of two or more, a spin kernel first holds the stream
  while all calls are launched, so the device runs them back to back as nccl-tests' loop does:
  otherwise a small message's kernel starts as soon as its rank launches it and its time
  includes waiting for slower-launching peers (c10d's launch path takes tens of microseconds).
  The first call absorbs the ranks' skew at the end of the spin and is not counted;
* CPU (gloo): the same profiler's ``gloo:<op>`` ranges, the time gloo's worker spends on the op;
* NPU: device events recorded back to back around each call, without host synchronisation, so
  the time between them is the device's time for the HCCL task (torch_npu's in-process profiler
  writes its data for offline parsing; under msprof the ``op_summary`` rows give kernel time).

``event`` mode measures what a caller waits for, launch included: the device is synchronised
before each iteration, then device events (CUDA, NPU) or ``time.perf_counter`` (CPU) bracket one
call and its completion.

Which of these applies is read from the rank's backend (``perf_plugin.backends``): its collector
(in-process profiler or msprof), its profiler activity (device kernels or host ranges), its
timing events, its spin kernel and its collective library's name.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend


class MeasurementError(RuntimeError):
    """The profile does not hold what the timed loop must have produced."""


class NoDeviceWork(MeasurementError):
    """The collective ran nothing on the device (NCCL's one-rank all_reduce is a no-op)."""


def _per_iteration(spans: Sequence[tuple[float, float]], iters: int, what: str) -> list[float]:
    """Group (start_us, end_us) spans into ``iters`` iterations; the iteration's time is its span."""
    spans = sorted(spans)
    if not spans:
        raise NoDeviceWork(f"the profile of {iters} calls holds no {what}: the collective ran no device work")
    if len(spans) % iters:
        raise MeasurementError(f"the profile of {iters} calls holds {len(spans)} {what}; cannot attribute them")
    per_call = len(spans) // iters
    durations = []
    for i in range(iters):
        group = spans[i * per_call : (i + 1) * per_call]
        durations.append(max(end for _, end in group) - group[0][0])
    return durations


CYCLES_PER_US = 2000  # about a 2 GHz GPU clock; a slower clock only lengthens the hold
MAX_HOLD_US = 2e6


def _stream_hold(call: Callable[[], Any], iters: int, backend: "Backend") -> Callable[[], None] | None:
    """A function queueing a spin kernel long enough for ``iters`` launches (None: unavailable)."""
    spin = backend.spin_kernel()
    if spin is None:
        return None
    begin = time.perf_counter()
    for _ in range(2):
        call()
    host_us = (time.perf_counter() - begin) / 2 * 1e6  # launch cost of one call on this host
    backend.synchronize()
    hold_us = min(2 * iters * host_us + 100, MAX_HOLD_US)
    return lambda: spin(int(hold_us * CYCLES_PER_US))


def _records_host_ranges(backend: "Backend") -> bool:
    """Whether the backend's profiler records host-side op ranges (gloo on the CPU) rather than
    device kernels."""
    return backend.profiler_activity == "CPU"


def _profiled_spans(
    call: Callable[[], Any], iters: int, backend: "Backend", hold: Callable[[], None] | None = None
) -> list[tuple[float, float]]:
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    sync = backend.synchronize
    library = backend.ccl
    sync()
    with warnings.catch_warnings():
        # torch 2.11+ warns that a profile without a schedule keeps one cycle: that is all we use
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*", category=UserWarning)
        with profile(activities=[getattr(ProfilerActivity, backend.profiler_activity)]) as prof:
            if hold is not None:
                hold()
            for _ in range(iters):
                call()
            sync()
        events = list(prof.events())
    if _records_host_ranges(backend):  # gloo's worker: ranges named "gloo:<op>"
        return [(e.time_range.start, e.time_range.end) for e in events if e.name.startswith(f"{library}:")]
    device = [
        e
        for e in events
        if e.device_type != DeviceType.CPU
        and not getattr(e, "is_user_annotation", False)
        and not e.name.startswith(f"{library}:")  # c10d's range mirrored on the device timeline, not a kernel
    ]
    kernels = [e for e in device if library in e.name.lower()]
    # A one-rank group runs no NCCL kernel: all_gather & co. become a device copy, which is then
    # the collective's device work (nothing else runs inside the profiled loop).
    return [(e.time_range.start, e.time_range.end) for e in (kernels or device)]


def _event_durations(
    call: Callable[[], Any], iters: int, event_type: Any, sync: Callable[[], None], back_to_back: bool
) -> list[float]:
    starts = [event_type(enable_timing=True) for _ in range(iters)]
    ends = [event_type(enable_timing=True) for _ in range(iters)]
    sync()
    for start, end in zip(starts, ends):
        if not back_to_back:
            sync()
        start.record()
        call()
        end.record()
    sync()
    return [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)]  # ms -> us


def _host_durations(call: Callable[[], Any], iters: int) -> list[float]:
    durations = []
    for _ in range(iters):
        begin = time.perf_counter()
        call()  # gloo's synchronous API returns once the op is complete on this rank
        durations.append((time.perf_counter() - begin) * 1e6)
    return durations


def time_collective(
    call: Callable[[], Any], iters: int, mode: str, backend: "Backend", group_size: int = 1
) -> list[float]:
    """``iters`` durations (us) of ``call`` on this rank, measured as ``mode`` says."""
    sync = backend.synchronize
    event_type = backend.timing_event()
    if mode == "kernel":
        if backend.collector != "torch":  # msprof times this backend's kernels, not torch.profiler
            return _event_durations(call, iters, event_type, sync, back_to_back=True)
        host_ranges = _records_host_ranges(backend)
        what = f"{backend.ccl} op ranges" if host_ranges else f"{backend.ccl.upper()} kernels"
        if not host_ranges and group_size > 1:
            hold = _stream_hold(call, iters + 1, backend)
            if hold is not None:
                spans = _profiled_spans(call, iters + 1, backend, hold)
                return _per_iteration(spans, iters + 1, what)[1:]
        return _per_iteration(_profiled_spans(call, iters, backend), iters, what)
    if event_type is None:
        return _host_durations(call, iters)
    return _event_durations(call, iters, event_type, sync, back_to_back=False)


def warm_up_profiler(backend: "Backend") -> None:
    """Start the profiler once before the first timed case: its first session in a process
    initialises the device's activity tracing (CUPTI), which inflates the first kernels it records."""
    if backend.collector != "torch" or _records_host_ranges(backend):
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    probe = torch.ones(1024, device=backend.torch_device())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*", category=UserWarning)
        with profile(activities=[getattr(ProfilerActivity, backend.profiler_activity)]):
            for _ in range(4):
                probe.mul_(1.0)
            backend.synchronize()
