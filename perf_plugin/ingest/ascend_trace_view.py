"""Read torch_npu's ``trace_view.json`` for the framework operator that launched each device kernel.

torch_npu's profiler writes ``ASCEND_PROFILER_OUTPUT/trace_view.json`` beside ``kernel_details.csv``:
Chrome trace JSON, a top-level array of events (``{"traceEvents": [...]}`` is read too).  The
events this module uses, as torch_npu writes them (the public Level1 profile of msinsight's test
data, ``test/data/pytorch/text/level1/rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json``):

* process names: ``{"ph": "M", "name": "process_name", "pid": P, "tid": 0, "args": {"name":
  "Ascend Hardware"}}`` (also ``"Python"``, ``"CANN"``, ``"Overlap Analysis"`` ...);
* framework operators: ``{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid", "tid",
  "ts": "1736408883688177.930", "dur": 145.57, "args": {"Sequence number", "Fwd thread id",
  "Input Dims": "32,1000;\\r\\n1000,4096", "Input type": "float;\\r\\nfloat", "Call stack"}}``;
  ``ts`` is a string of microseconds with three decimals;
* device tasks, on the ``Ascend Hardware`` process, one thread per stream: ``{"ph": "X", "name":
  <kernel_details' Name>, "ts": <its Start Time(us)>, "dur": <its Duration(us)>, "args":
  {"Model Id", "Task Type", "Physic Stream Id", "Task Id", "Batch Id", "Subtask Id",
  "connection_id"}}``;
* launch links: ``{"ph": "s", "bp": "e", "cat": "async_npu", "name": "torch_to_npu", "id": N,
  "pid", "tid", "ts": <the launching operator's ts>}`` and its ``"ph": "f"`` twin on the device
  task (same ``id``; ``pid``/``tid``/``ts`` those of the task).

A kernel is found by its start time (``kernel_details``' ``Start Time(us)`` is the task's
``ts``), follows its ``torch_to_npu`` link back to the launching thread, and takes the innermost
framework operator there, among those ``wanted`` names, whose span holds the link's start.  Times
are compared as integer nanoseconds parsed from the decimal text (a float would lose the last
digits of a 16-digit microsecond timestamp).  Some torch_npu releases write the events' ``ts``
as JSON floats instead (its trace event writer's ``convert_ns2us_float``), which keep a 16-digit
microsecond time to within a quarter of a microsecond: a kernel whose start no link ends at
exactly takes the one link ending within ``FLOAT_TS_SLACK_NS`` of it, and none when two do.
The whole file is read into memory: traces of a few profiled steps are tens of megabytes.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.ingest.json_file import load_json_file

HARDWARE_PROCESS = "Ascend Hardware"
LAUNCH_FLOW = "torch_to_npu"
LAUNCH_CATEGORY = "async_npu"
OPERATOR_CATEGORY = "cpu_op"
INPUT_DIMS = "Input Dims"
INPUT_TYPES = "Input type"
_NS_PER_US = Decimal(1000)
# Half a microsecond: above the rounding of a float timestamp below 2**52 us (an eighth to a
# quarter of a microsecond), below the spacing of kernel launches on one stream.
FLOAT_TS_SLACK_NS = 500


@dataclass(frozen=True)
class LaunchingOperator:
    """The framework operator that launched a kernel, with what the trace recorded of its call."""

    name: str
    input_dims: str  # slots separated by ``;`` (and a line break), dimensions by ``,``
    input_types: str
    start_ns: int


def to_ns(value: object) -> int | None:
    """A trace or kernel_details timestamp in microseconds (text or number) as integer nanoseconds."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int((Decimal(str(value).strip()) * _NS_PER_US).to_integral_value())
    except (InvalidOperation, ValueError):
        return None


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The events of a trace_view.json; DatabaseError naming the file (and line, column) otherwise."""
    path = Path(path)
    data = load_json_file(path)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise DatabaseError("not a Chrome trace: expected an array of events or {\"traceEvents\": [...]}", path=path)
    return [event for event in events if isinstance(event, dict)]


def _hardware_pids(events: Iterable[Mapping[str, Any]]) -> set[Any]:
    return {
        event.get("pid")
        for event in events
        if event.get("ph") == "M" and event.get("name") == "process_name"
        and isinstance(event.get("args"), dict) and event["args"].get("name") == HARDWARE_PROCESS
    }  # fmt: skip


def _launch_sources(events: Iterable[Mapping[str, Any]], hardware: set[Any]) -> dict[int, tuple[Any, Any, int]]:
    """Device task start (ns) -> (pid, tid, ns) where the ``torch_to_npu`` link to it starts."""
    starts: dict[Any, Mapping[str, Any]] = {}
    finishes: dict[Any, Mapping[str, Any]] = {}
    for event in events:
        if event.get("name") != LAUNCH_FLOW or event.get("cat") != LAUNCH_CATEGORY or "id" not in event:
            continue
        if event.get("ph") == "s":
            starts[str(event["id"])] = event
        elif event.get("ph") == "f" and (not hardware or event.get("pid") in hardware):
            finishes[str(event["id"])] = event
    sources: dict[int, tuple[Any, Any, int]] = {}
    for key, finish in finishes.items():
        start = starts.get(key)
        task_ns, launch_ns = to_ns(finish.get("ts")), to_ns(start.get("ts")) if start is not None else None
        if start is not None and task_ns is not None and launch_ns is not None:
            sources[task_ns] = (start.get("pid"), start.get("tid"), launch_ns)
    return sources


Span = tuple[int, int, Mapping[str, Any]]  # (start ns, end ns, event)


def _operators(events: Iterable[Mapping[str, Any]], wanted: Callable[[str], bool]) -> dict[tuple[Any, Any], list[Span]]:
    """Per (pid, tid): the wanted framework operators' spans."""
    spans: dict[tuple[Any, Any], list[Span]] = defaultdict(list)
    for event in events:
        if event.get("ph") != "X" or event.get("cat") != OPERATOR_CATEGORY or not wanted(str(event.get("name", ""))):
            continue
        start, duration = to_ns(event.get("ts")), to_ns(event.get("dur", 0))
        if start is not None:
            spans[(event.get("pid"), event.get("tid"))].append((start, start + (duration or 0), event))
    return spans


def _nearest(sources: Mapping[int, tuple[Any, Any, int]], ends: list[int], start: int) -> tuple[Any, Any, int] | None:
    """The link ending within ``FLOAT_TS_SLACK_NS`` of ``start`` when exactly one does (a float ``ts``)."""
    low = bisect.bisect_left(ends, start - FLOAT_TS_SLACK_NS)
    high = bisect.bisect_right(ends, start + FLOAT_TS_SLACK_NS)
    return sources[ends[low]] if high - low == 1 else None


def launching_operators(
    events: list[dict[str, Any]], kernel_starts: Iterable[int], wanted: Callable[[str], bool]
) -> dict[int, LaunchingOperator]:
    """For each kernel start (ns) whose launch the trace links to a wanted operator: that operator."""
    sources = _launch_sources(events, _hardware_pids(events))
    spans = _operators(events, wanted)
    found: dict[int, LaunchingOperator] = {}
    ends = sorted(sources)
    for start in kernel_starts:
        source = sources.get(start)
        if source is None:
            source = _nearest(sources, ends, start)
        if source is None:
            continue
        pid, tid, launch_ns = source
        holding = [span for span in spans.get((pid, tid), []) if span[0] <= launch_ns <= span[1]]
        if not holding:
            continue
        begin, _, event = max(holding, key=lambda span: (span[0], -span[1]))  # the innermost
        args = event["args"] if isinstance(event.get("args"), dict) else {}
        found[start] = LaunchingOperator(
            str(event.get("name", "")), str(args.get(INPUT_DIMS, "")), str(args.get(INPUT_TYPES, "")), begin
        )
    return found
