"""PyTorch profiler events in one form, from a Chrome trace file or a live profiler object.

``torch.profiler`` (Kineto) records three kinds of events that ingest needs:

* CPU operators (``cat: cpu_op``): name, thread, start, duration, and with ``record_shapes=True``
  the input dims, input types and concrete scalar inputs;
* runtime launches (``cat: cuda_runtime`` / ``cuda_driver``: ``cudaLaunchKernel``...) on the
  CPU thread, carrying the CUPTI ``correlation`` id;
* device activities (``cat: kernel``, ``gpu_memcpy``, ``gpu_memset``) carrying the same
  ``correlation`` id, and the ``External id`` of the operator that was running at launch;
* the ranges an input-value capture put around the calls it recorded (``perf_values/...``,
  ``perf_plugin.trace.values_file``), whatever their category;
* with ``profile_memory=True``, the allocators' events (``[memory]`` instant events: address,
  size, device type), read from trace files only (``read_profiler`` leaves them out).

``export_chrome_trace`` writes them as JSON (``ts``/``dur`` in microseconds with nanosecond
decimals); a live ``profile`` object holds them as ``_KinetoEvent`` objects.  Both become
``TraceData`` here, with times in integer nanoseconds so that nesting tests are exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.ingest.json_file import load_json_file
from perf_plugin.trace.events import DeviceActivity, Launch, MemoryEvent, TraceData, TraceOp, ValueMark
from perf_plugin.trace.values_file import MARK_PREFIX

CPU_OP_CATEGORIES = frozenset({"cpu_op", "operator"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "runtime", "privateuse1_runtime"})
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
FLOW_CATEGORIES = frozenset({"ac2g"})
MEMORY_EVENT_NAME = "[memory]"


def _ns(microseconds: Any) -> int:
    return int(round(float(microseconds) * 1000.0))


def _int_or_none(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def read_chrome_trace(path: str | Path) -> TraceData:
    """Events of a trace written by ``torch.profiler.profile.export_chrome_trace``."""
    path = Path(path)
    document = load_json_file(path, "a JSON trace")
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise DatabaseError("not a Chrome trace: no 'traceEvents' list", path=path)

    ops: list[TraceOp] = []
    launches: list[Launch] = []
    flow_ends: dict[tuple[Any, Any, int], int] = {}
    pending: list[tuple[dict[str, Any], str]] = []
    memory: list[MemoryEvent] = []
    marks: list[ValueMark] = []
    has_shapes = bool(document.get("record_shapes")) if isinstance(document, dict) else False
    for event in events:
        if not isinstance(event, dict):
            continue
        category = str(event.get("cat", "")).lower()
        phase = event.get("ph")
        if category in FLOW_CATEGORIES and phase == "f":
            flow_id = _int_or_none(event.get("id"))
            if flow_id is not None and "ts" in event:
                flow_ends[(event.get("pid"), event.get("tid"), _ns(event["ts"]))] = flow_id
            continue
        if phase == "i" and event.get("name") == MEMORY_EVENT_NAME:
            memory.extend(_memory_event(event))
            continue
        if phase != "X" or "ts" not in event:
            continue
        args = event.get("args") or {}
        start = _ns(event["ts"])
        duration = _ns(event.get("dur", 0))
        thread = (_int_or_none(event.get("pid")) or 0, _int_or_none(event.get("tid")) or 0)
        name = str(event.get("name", ""))
        if name.startswith(MARK_PREFIX):
            marks.append(ValueMark(name, thread, start, start + duration))
        elif category in CPU_OP_CATEGORIES:
            has_shapes = has_shapes or "Input Dims" in args
            ops.append(_trace_op(event, args, thread, start, duration))
        elif category in LAUNCH_CATEGORIES:
            launches.append(
                Launch(
                    str(event.get("name", "")),
                    thread,
                    start,
                    _int_or_none(args.get("correlation")),
                    _int_or_none(args.get("External id")),
                )
            )
        elif category in DEVICE_CATEGORIES:
            pending.append((event, category))
    activities = [_device_activity(event, category, flow_ends) for event, category in pending]
    return TraceData(ops, launches, activities, _device_name(document), path, has_shapes, memory, marks)


def _memory_event(event: dict[str, Any]) -> list[MemoryEvent]:
    """The event as a MemoryEvent, or nothing where a field is missing or malformed."""
    args = event.get("args") or {}
    address, size = _int_or_none(args.get("Addr")), _int_or_none(args.get("Bytes"))
    if address is None or not size or "ts" not in event:
        return []
    thread = (_int_or_none(event.get("pid")) or 0, _int_or_none(event.get("tid")) or 0)
    return [MemoryEvent(thread, _ns(event["ts"]), address, size, _int_or_none(args.get("Device Type")) or 0)]


def _trace_op(event: dict[str, Any], args: dict[str, Any], thread: tuple[int, int], start: int, duration: int) -> TraceOp:
    return TraceOp(
        name=str(event.get("name", "")),
        thread=thread,
        start_ns=start,
        end_ns=start + duration,
        external_id=_int_or_none(args.get("External id")),
        record_id=_int_or_none(args.get("Record function id")) or None,  # 0: recorded without one
        dims=list(args.get("Input Dims") or []),
        types=[str(t) for t in (args.get("Input type") or [])],
        concrete=list(args.get("Concrete Inputs") or []),
        strides=list(args.get("Input Strides") or []),
    )


def _device_activity(
    event: dict[str, Any], category: str, flow_ends: dict[tuple[Any, Any, int], int]
) -> DeviceActivity:
    args = event.get("args") or {}
    start = _ns(event["ts"])
    correlation = _int_or_none(args.get("correlation"))
    if correlation is None:
        # Older traces link launch and kernel only through an "ac2g" flow event.
        correlation = flow_ends.get((event.get("pid"), event.get("tid"), start))
    return DeviceActivity(
        str(event.get("name", "")), category, start, _ns(event.get("dur", 0)), correlation,
        _int_or_none(args.get("External id")),
    )


def _device_name(document: Any) -> str | None:
    if isinstance(document, dict):
        for properties in document.get("deviceProperties") or []:
            if isinstance(properties, dict) and properties.get("name"):
                return str(properties["name"])
    return None


def _kineto_results(profiler: Any) -> Any:
    inner = getattr(profiler, "profiler", None)  # torch.profiler.profile wraps the autograd profiler
    for candidate in (inner, profiler):
        results = getattr(candidate, "kineto_results", None)
        if results is not None:
            return results
    raise DatabaseError(
        "the profiler object holds no results: pass a torch.profiler.profile after its 'with' block "
        "(or after stop())"
    )


def _live_category(event: Any) -> str:
    """Kineto activity type; older releases (no ``activity_type``) are classified by device/link."""
    activity_type = getattr(event, "activity_type", None)
    if activity_type is not None:
        return str(activity_type()).lower()
    if "CPU" not in str(event.device_type()):
        name = event.name().lower()
        return "gpu_memcpy" if name.startswith("memcpy") else "gpu_memset" if name.startswith("memset") else "kernel"
    # Runtime calls carry the id of the operator that made them; operators carry none.
    return "cuda_runtime" if int(event.linked_correlation_id()) > 0 else "cpu_op"


def _live_dims(event: Any) -> list[Any]:
    structured = getattr(event, "structured_input_shapes", None)
    return list((structured() if structured is not None else event.shapes()) or [])


def _live_strides(event: Any) -> list[Any]:
    structured = getattr(event, "structured_input_strides", None)  # torch releases that record them
    return list((structured() if structured is not None else []) or [])


def read_profiler(profiler: Any) -> TraceData:
    """Events of a finished ``torch.profiler.profile`` (or ``torch.autograd.profiler.profile``)."""
    ops: list[TraceOp] = []
    launches: list[Launch] = []
    activities: list[DeviceActivity] = []
    marks: list[ValueMark] = []
    has_shapes = False
    for event in _kineto_results(profiler).events():
        category = _live_category(event)
        start = int(event.start_ns())
        duration = int(event.duration_ns())
        thread = (0, int(event.start_thread_id()))
        if event.name().startswith(MARK_PREFIX):
            marks.append(ValueMark(event.name(), thread, start, start + duration))
        elif category in CPU_OP_CATEGORIES:
            dims = _live_dims(event)
            has_shapes = has_shapes or any(dims)
            # A CPU op's correlation id is its External id: device events point at it.
            ops.append(
                TraceOp(
                    name=event.name(),
                    thread=thread,
                    start_ns=start,
                    end_ns=start + duration,
                    external_id=int(event.correlation_id()),
                    dims=dims,
                    types=[str(t) for t in (event.dtypes() or [])],
                    concrete=list(event.concrete_inputs() or []),
                    strides=_live_strides(event),
                )
            )
        elif category in LAUNCH_CATEGORIES:
            launches.append(
                Launch(
                    event.name(),
                    thread,
                    start,
                    int(event.correlation_id()),
                    int(event.linked_correlation_id()) or None,
                )
            )
        elif category in DEVICE_CATEGORIES:
            activities.append(
                DeviceActivity(
                    event.name(),
                    category,
                    start,
                    duration,
                    int(event.correlation_id()) or None,
                    int(event.linked_correlation_id()) or None,
                )
            )
    return TraceData(ops, launches, activities, None, None, has_shapes, value_marks=marks)
