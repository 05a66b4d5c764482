"""Attach a capture's recorded input values to the traced calls they belong to.

An input-value capture (``perf_plugin.capture``) wraps each call it recorded in a profiler range
``perf_values/<token>/<n>`` and writes the values under ``<n>`` to a values file
(``perf_plugin.trace.values_file``).  The call is the outermost operator that range encloses on
its thread; it gets the values as ``TraceOp.values``, which the kernel type's trace mapper puts
in the row's ``Input Values`` cell.  Ranges of another capture (another token), ranges with no
entry in the file, and entries with no range in the trace are counted, never guessed at.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.trace.events import TraceData, TraceOp
from perf_plugin.trace.values_file import CapturedValues, parse_mark, read_values_file, sidecar_path


@dataclass
class ValuesAttachment:
    """What one values file gave a trace, for the ingest report."""

    source: Path | None
    captured: int = 0  # calls in the file
    attached: int = 0  # operators that got values
    other_capture: int = 0  # ranges of another capture's token
    without_entry: int = 0  # ranges of this capture with no entry in the file
    without_operator: int = 0  # ranges that enclose no operator

    def lines(self) -> list[str]:
        where = f" ({self.source})" if self.source is not None else ""
        out = [f"  input values{where}: {self.attached} of {self.captured} captured call(s) attached"]
        for count, what in ((self.other_capture, "ranges of another capture (other token), ignored"),
                            (self.without_entry, "ranges with no entry in the values file"),
                            (self.without_operator, "ranges around no operator")):
            if count:
                out.append(f"    {what}: {count}")
        if self.attached < self.captured:
            out.append("    calls missing from the trace: the capture must run inside the profiled region")
        return out


def values_for_trace(trace_path: Path, explicit: Path | None) -> CapturedValues | None:
    """The values file given, else the one beside the trace (``run.values.json``), else None."""
    if explicit is not None:
        return read_values_file(explicit)
    beside = sidecar_path(trace_path)
    return read_values_file(beside) if beside.is_file() else None


def attach_values(trace: TraceData, captured: CapturedValues) -> ValuesAttachment:
    """Set ``values`` on every operator a range of ``captured`` encloses."""
    report = ValuesAttachment(captured.source, captured=len(captured.calls))
    by_thread = _ops_by_thread(trace.ops)
    for mark in trace.value_marks:
        parsed = parse_mark(mark.key)
        if parsed is None:
            continue
        token, key = parsed
        if token != captured.token:
            report.other_capture += 1
            continue
        call = captured.calls.get(key)
        if call is None:
            report.without_entry += 1
            continue
        op = _outermost_inside(by_thread.get(mark.thread), mark.start_ns, mark.end_ns)
        if op is None:
            report.without_operator += 1
            continue
        op.values = dict(call.values)
        op.quantiles = dict(call.quantiles)
        op.depths = dict(call.depths)
        op.zeros = dict(call.zeros)
        op.masked = dict(call.masked)
        op.distinct = dict(call.distinct)
        report.attached += 1
    return report


def _ops_by_thread(ops: list[TraceOp]) -> dict[tuple[int, int], tuple[list[int], list[TraceOp]]]:
    grouped: dict[tuple[int, int], list[TraceOp]] = defaultdict(list)
    for op in ops:
        grouped[op.thread].append(op)
    out = {}
    for thread, members in grouped.items():
        members.sort(key=lambda op: (op.start_ns, -op.end_ns))  # a parent before its children
        out[thread] = ([op.start_ns for op in members], members)
    return out


def _outermost_inside(
    indexed: tuple[list[int], list[TraceOp]] | None, start: int, end: int
) -> TraceOp | None:
    if indexed is None:
        return None
    starts, ops = indexed
    for position in range(bisect.bisect_left(starts, start), len(ops)):
        op = ops[position]
        if op.start_ns > end:
            break
        if op.end_ns <= end:
            return op
    return None
