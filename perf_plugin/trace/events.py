"""The operators, launches and device activities of one PyTorch profile, as plain data.

Readers (``perf_plugin.ingest.trace_events``) build these from a Chrome trace file or a live
profiler; the attribution step links operators to the kernels they launched; kernel types map
operators to database rows (``perf_plugin.trace.mapped``).  Times are integer nanoseconds so
that nesting tests are exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(eq=False)
class TraceOp:
    """A CPU operator; ``children`` and ``parent`` are filled by the attribution step."""

    name: str
    thread: tuple[int, int]
    start_ns: int
    end_ns: int
    external_id: int | None = None
    # the profiler's ``Record function id``: the operator's node in an execution trace (perf_plugin.ingest.execution_trace)
    record_id: int | None = None
    dims: list[Any] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    concrete: list[Any] = field(default_factory=list)
    strides: list[Any] = field(default_factory=list)  # per argument, as ``dims`` (empty when not recorded)
    # argument index -> the dtype of each tensor of that list, which the profiler does not record
    # (from an execution trace, perf_plugin.ingest.traced_lists)
    list_dtypes: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # argument index -> the flattened values of that integer tensor, where a capture recorded
    # them (perf_plugin.capture; attached by perf_plugin.ingest.input_values)
    values: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # argument index -> quantiles of that floating input's values (top-k's), likewise
    quantiles: dict[int, tuple[float, ...]] = field(default_factory=dict)
    # argument index -> that top-k input's selection depths (depth -> rows), likewise
    depths: dict[int, dict[int, int]] = field(default_factory=dict)
    # argument index -> the share of that floating input's elements that were zero (a division's), likewise
    zeros: dict[int, float] = field(default_factory=dict)
    # argument index -> the share of that index input's values that were distinct (a gather's), likewise
    distinct: dict[int, float] = field(default_factory=dict)
    # argument index -> (share of masked elements, masked runs per row) of a softmax's input, likewise
    masked: dict[int, tuple[float, float]] = field(default_factory=dict)
    children: list["TraceOp"] = field(default_factory=list)
    parent: "TraceOp | None" = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def descendants(self) -> list["TraceOp"]:
        """The operators this one called, in call order (pre-order)."""
        found: list[TraceOp] = []
        stack = list(reversed(self.children))
        while stack:
            node = stack.pop()
            found.append(node)
            stack.extend(reversed(node.children))
        return found


@dataclass(frozen=True)
class Launch:
    name: str
    thread: tuple[int, int]
    start_ns: int
    correlation: int | None
    external_id: int | None


@dataclass(frozen=True)
class DeviceActivity:
    name: str
    category: str
    start_ns: int
    duration_ns: int
    correlation: int | None
    external_id: int | None


@dataclass(frozen=True)
class MemoryEvent:
    """An allocation (``size`` > 0) or release (``size`` < 0) of a block by an allocator, as a
    profile taken with ``profile_memory=True`` records it (``[memory]`` instant events)."""

    thread: tuple[int, int]
    time_ns: int
    address: int
    size: int
    device_type: int  # the profiler's device type: 0 the CPU, 1 CUDA


@dataclass(frozen=True)
class ValueMark:
    """A capture's annotation around one call whose input values it recorded: the call is the
    operator the range encloses on its thread; ``key`` is the range's name
    (``perf_values/<token>/<n>``, ``perf_plugin.trace.values_file``)."""

    key: str
    thread: tuple[int, int]
    start_ns: int
    end_ns: int


@dataclass
class TraceData:
    ops: list[TraceOp]
    launches: list[Launch]
    activities: list[DeviceActivity]
    device_name: str | None = None
    source: Path | None = None
    has_shapes: bool = False
    memory: list[MemoryEvent] = field(default_factory=list)  # empty unless profiled with profile_memory
    value_marks: list[ValueMark] = field(default_factory=list)  # empty unless a capture ran
