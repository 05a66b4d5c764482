"""Attribute profiler events to the labelled ranges of cases and repeats.

Works on plain tuples, so it is unit-testable without a profiler.  Each timed repeat runs inside
a CPU-side range labelled ``perfcase::<case number>::<repeat>``.

* Device kernels (CUDA kernels, memcpy, memset) are attributed through their launch: the device
  event and the runtime call that launched it share a correlation id, and the runtime call's CPU
  timestamp falls inside the range.  A repeat's duration is the sum of its kernels' device
  durations (gaps between kernels are not the kernels' time).
* On the CPU, a repeat's duration is the sum of the top-level operator events inside the range
  (nested ops are part of their parent's time).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

RANGE_PREFIX = "perfcase::"


@dataclass(frozen=True)
class RawEvent:
    name: str
    on_device: bool  # a device-side activity (kernel, memcpy, memset)
    start_ns: int
    duration_ns: int
    correlation_id: int
    thread: int
    is_annotation: bool


@dataclass
class RepeatTiming:
    total_ns: int = 0
    kernels: dict[str, tuple[int, int]] | None = None  # name -> (total ns, count)

    def add(self, name: str, duration_ns: int) -> None:
        self.total_ns += duration_ns
        if self.kernels is None:
            self.kernels = {}
        total, count = self.kernels.get(name, (0, 0))
        self.kernels[name] = (total + duration_ns, count + 1)


def parse_range_name(name: str) -> tuple[int, int] | None:
    if not name.startswith(RANGE_PREFIX):
        return None
    parts = name[len(RANGE_PREFIX):].split("::")
    if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


def _ranges(events: list[RawEvent]) -> list[tuple[int, int, int, tuple[int, int]]]:
    found = []
    for event in events:
        if event.on_device or not event.is_annotation:
            continue
        key = parse_range_name(event.name)
        if key is not None:
            found.append((event.start_ns, event.start_ns + event.duration_ns, event.thread, key))
    found.sort()
    return found


def attribute_device_kernels(events: list[RawEvent]) -> dict[tuple[int, int], RepeatTiming]:
    """(case number, repeat) -> timing from device events, linked through correlation ids."""
    ranges = _ranges(events)
    starts = [r[0] for r in ranges]
    launch_time: dict[int, int] = {}
    for event in events:
        if not event.on_device and not event.is_annotation and event.correlation_id:
            # CPU-side events carrying a correlation id are the runtime launches; keep the earliest
            launch_time.setdefault(event.correlation_id, event.start_ns)
    timings: dict[tuple[int, int], RepeatTiming] = defaultdict(RepeatTiming)
    for event in events:
        if not event.on_device or event.is_annotation:
            continue
        at = launch_time.get(event.correlation_id)
        if at is None:
            continue
        position = bisect.bisect_right(starts, at) - 1
        if position < 0:
            continue
        start, end, _thread, key = ranges[position]
        if start <= at <= end:
            timings[key].add(event.name, event.duration_ns)
    return dict(timings)


def attribute_cpu_ops(events: list[RawEvent]) -> dict[tuple[int, int], RepeatTiming]:
    """(case number, repeat) -> timing from the top-level CPU operators inside each range."""
    ranges = _ranges(events)
    by_thread: dict[int, list[RawEvent]] = defaultdict(list)
    for event in events:
        if not event.on_device and not event.is_annotation and parse_range_name(event.name) is None:
            by_thread[event.thread].append(event)
    for ops in by_thread.values():
        ops.sort(key=lambda e: (e.start_ns, -e.duration_ns))
    thread_starts = {t: [e.start_ns for e in ops] for t, ops in by_thread.items()}
    timings: dict[tuple[int, int], RepeatTiming] = {}
    for start, end, thread, key in ranges:
        ops = by_thread.get(thread, [])
        first = bisect.bisect_left(thread_starts.get(thread, []), start)
        timing = RepeatTiming()
        covered_until = start
        for op in ops[first:]:
            if op.start_ns > end:
                break
            if op.start_ns < covered_until:
                continue  # nested inside a top-level op already counted
            timing.add(op.name, op.duration_ns)
            covered_until = op.start_ns + op.duration_ns
        timings[key] = timing
    return timings
