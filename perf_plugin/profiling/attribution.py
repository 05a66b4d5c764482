"""Attribute profiler events to the cases and repeats that produced them.

Works on plain records, so it is unit-testable without a profiler.

* Device kernels (CUDA kernels, memcpy, memset) are delimited by marker kernels
  (``attribute_by_markers``): by default one before a case's first timed repeat and one after
  its last, the repeats in between split into equal runs of the same kernel sequence
  (``split_repeats``); or one marker before every repeat.  A repeat's duration is the sum of its
  kernels' device durations: gaps between kernels are launch latency, not the kernels' time.
* On the CPU the timed repeats run inside ranges labelled ``perfcase::<case number>::<repeat>``,
  or all of them inside one range ``perfcase::<case number>::all`` whose top-level operator
  events are split into equal runs of one operator sequence (``split_repeats``), as CUDA splits
  kernels between markers.  A repeat's duration is the sum of its top-level operator events
  (nested ops are part of their parent's time).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

RANGE_PREFIX = "perfcase::"
SPAN = -1  # the repeat of a range holding every timed repeat of a case (``perfcase::<n>::all``)
SPAN_LABEL = "all"


class RawEvent(NamedTuple):
    """One profiler event (a named tuple: flushing builds hundreds of thousands of them)."""

    name: str
    on_device: bool  # a device-side activity (kernel, memcpy, memset)
    start_ns: int
    duration_ns: int
    correlation_id: int
    thread: int
    is_annotation: bool


class Attribution(NamedTuple):
    timings: dict[tuple[int, int], RepeatTiming]  # (case number, repeat) -> timing
    error: str | None  # the whole batch is unusable (events were lost)
    case_errors: dict[int, str]  # case number -> why its repeats could not be separated


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
    """(case number, repeat) of a range label; the repeat is ``SPAN`` for a whole-case range."""
    if not name.startswith(RANGE_PREFIX):
        return None
    parts = name[len(RANGE_PREFIX):].split("::")
    if len(parts) != 2 or not parts[0].isdigit():
        return None
    if parts[1] == SPAN_LABEL:
        return int(parts[0]), SPAN
    if not parts[1].isdigit():
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


def attribute_cpu_ops(events: list[RawEvent], span_repeats: Mapping[int, int] | None = None) -> Attribution:
    """(case number, repeat) -> timing from the top-level CPU operators inside each range.

    ``span_repeats`` gives the repeat count of each case timed in one whole-case range; a case
    whose operator events there are not that many runs of one sequence gets a case error.
    """
    ranges = _ranges(events)
    by_thread: dict[int, list[RawEvent]] = defaultdict(list)
    for event in events:
        if not event.on_device and not event.is_annotation and parse_range_name(event.name) is None:
            by_thread[event.thread].append(event)
    for ops in by_thread.values():
        # by start time, and the longest first among equal starts (a parent before its children);
        # two stable sorts on C-level keys instead of one Python key function
        ops.sort(key=attrgetter("duration_ns"), reverse=True)
        ops.sort(key=attrgetter("start_ns"))
    thread_starts = {t: [e.start_ns for e in ops] for t, ops in by_thread.items()}
    timings: dict[tuple[int, int], RepeatTiming] = {}
    case_errors: dict[int, str] = {}
    for start, end, thread, key in ranges:
        ops = by_thread.get(thread, [])
        index = bisect.bisect_left(thread_starts.get(thread, []), start)
        top_level: list[RawEvent] = []
        covered_until = start
        while index < len(ops):
            op = ops[index]
            index += 1
            if op.start_ns > end:
                break
            if op.start_ns < covered_until:
                continue  # nested inside a top-level op already counted
            top_level.append(op)
            covered_until = op.start_ns + op.duration_ns
        number, repeat = key
        if repeat != SPAN:
            timings[key] = _timing_of(top_level)
            continue
        repeats = (span_repeats or {}).get(number, 0)
        runs = split_repeats(top_level, repeats)
        if runs is None:
            case_errors[number] = (
                f"{len(top_level)} operator events over {repeats} repeats are not the same operator sequence per "
                "repeat; run with --perf-repeat-markers to label every repeat"
            )
            continue
        for index_in_case, run in enumerate(runs):
            timings[(number, index_in_case)] = _timing_of(run)
    return Attribution(timings, None, case_errors)


def _timing_of(events: list[RawEvent]) -> RepeatTiming:
    timing = RepeatTiming()
    for event in events:
        timing.add(event.name, event.duration_ns)
    return timing


MARKER_KERNEL = "spin_kernel"  # the kernel torch.cuda._sleep launches; delimits repeats on CUDA


class CaseSpan(NamedTuple):
    """A marker segment holding all timed repeats of one case, launched back to back."""

    number: int
    repeats: int


# What the device work after a marker belongs to: one repeat (case number, repeat), all repeats
# of a case (CaseSpan), or nothing to time (None).
Segment = tuple[int, int] | CaseSpan | None


def split_repeats(kernels: list[RawEvent], repeats: int) -> list[list[RawEvent]] | None:
    """``kernels`` (launch order) as ``repeats`` runs of one kernel sequence, or None.

    Every call of a replay after its warm-up launches the same kernels in the same order, so the
    device events of R back-to-back calls are R copies of one sequence: the period is
    len(kernels) / R, and every run must repeat the first one's kernel names.  A sequence that is
    not R copies of one period (an op whose kernel count varies from call to call) is refused
    rather than guessed.  No kernels at all gives R empty repeats.
    """
    if repeats <= 0:
        return None
    if not kernels:
        return [[] for _ in range(repeats)]
    if len(kernels) % repeats:
        return None
    period = len(kernels) // repeats
    names = [kernel.name for kernel in kernels]
    first = names[:period]
    for start in range(period, len(names), period):
        if names[start:start + period] != first:
            return None
    return [kernels[start:start + period] for start in range(0, len(kernels), period)]


def _timed_repeats(segment: Segment) -> int:
    """How many timed repeats follow a marker of this segment (0: untimed work follows)."""
    if segment is None:
        return 0
    return segment.repeats if isinstance(segment, CaseSpan) else 1


def own_markers(marker_events: list[RawEvent], segments: list[Segment]) -> set[int] | None:
    """Which of ``marker_events`` (launch order) the collector launched, when the timed work of
    one case launched the marker kernel too; None when that cannot be told.

    The collector launched exactly one marker per segment.  When every timed repeat belongs to
    one case, each repeat launched the same kernel sequence, so the same number ``s`` of extra
    markers: after a marker whose segment is timed, the next ``s`` markers per repeat are the
    work's own and the one after them is the collector's next; untimed work between (a cache
    flush) launches none.  A profiler session of that one case alone (how candidate kernels are
    timed) always satisfies this; a batch of several cases where one launched markers does not.
    """
    cases = {s[0] for s in segments if s is not None}
    extra = len(marker_events) - len(segments)
    timed = sum(_timed_repeats(s) for s in segments)
    if len(cases) != 1 or extra <= 0 or timed == 0 or extra % timed:
        return None
    per_repeat = extra // timed
    own: set[int] = set()
    position = 0
    for segment in segments:
        own.add(marker_events[position].correlation_id)
        position += 1 + per_repeat * _timed_repeats(segment)
    return own if position == len(marker_events) else None


def attribute_by_markers(
    device_events: list[RawEvent],
    segments: list[Segment],
    is_marker: Callable[[str], bool] = lambda name: MARKER_KERNEL in name,
) -> Attribution:
    """(case number, repeat) -> timing from device events delimited by marker kernels.

    The collector launches a tiny marker kernel before the timed work of a case (before each
    repeat, or once before all of them), after it, and around cold-cache flushes, recording in
    ``segments`` what the device work after each marker belongs to.  Correlation ids grow in
    launch order, so sorting device events by correlation id and walking the markers assigns
    every kernel to its case without recording any CPU-side operator events, which is what makes
    the in-process profiler cheap enough for small kernels.  The error text is set when the
    number of markers seen differs from the number launched (events were lost) and cannot be
    explained by one case's work launching the marker kernel itself (``own_markers``).
    """
    ordered = sorted((e for e in device_events if e.on_device and not e.is_annotation), key=lambda e: e.correlation_id)
    marker_events = [e for e in ordered if is_marker(e.name)]
    own: set[int] | None = None  # None: every marker kernel is the collector's
    if len(marker_events) > len(segments):
        own = own_markers(marker_events, segments)
    timings: dict[tuple[int, int], RepeatTiming] = {}
    spans: dict[CaseSpan, list[RawEvent]] = {}
    current: Segment = None
    span_events: list[RawEvent] | None = None
    seen = 0
    for event in ordered:
        if is_marker(event.name) and (own is None or event.correlation_id in own):
            current = segments[seen] if seen < len(segments) else None
            seen += 1
            span_events = None
            if isinstance(current, CaseSpan):
                span_events = spans.setdefault(current, [])
            elif current is not None:
                timings.setdefault(current, RepeatTiming())
            continue
        if span_events is not None:
            span_events.append(event)
        elif current is not None:
            timings[current].add(event.name, event.duration_ns)
    case_errors: dict[int, str] = {}
    for span, kernels in spans.items():
        runs = split_repeats(kernels, span.repeats)
        if runs is None:
            case_errors[span.number] = (
                f"{len(kernels)} device kernels over {span.repeats} repeats are not the same kernel sequence per "
                "repeat; run with --perf-repeat-markers to delimit every repeat"
            )
            continue
        for repeat, run in enumerate(runs):
            timings[(span.number, repeat)] = _timing_of(run)
    return Attribution(timings, _marker_count_error(seen, len(segments)), case_errors)


def _marker_count_error(seen: int, launched: int) -> str | None:
    """Why a batch's markers cannot delimit its cases (None: they can)."""
    if seen == launched:
        return None
    if seen < launched:
        return f"the profiler returned {seen} marker kernels for {launched} launched: events were lost"
    return (
        f"the profiler returned {seen} marker kernels for {launched} launched: the timed work launched the marker "
        f"kernel itself ({MARKER_KERNEL}: torch.cuda._sleep), which cannot be told from the markers in a batch of "
        "several cases"
    )
