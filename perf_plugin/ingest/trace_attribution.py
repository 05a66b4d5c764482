"""Which operator launched which device kernel, and how long each operator ran.

The unit of a database row is a *top-level operator*: a CPU op named ``namespace::op``
(``aten::addmm``, ``vllm::rms_norm``) with no such operator around it on its thread.  Annotation
ranges (``ProfilerStep#3``, ``nn.Module`` scopes, ``record_function`` labels, autograd nodes such
as ``autograd::engine::evaluate_function: AddmmBackward0``) are transparent, so a backward
``aten::mm`` is a top-level operator of its own.  Ops nest on a thread by time: events of one
thread are properly nested, so a stack over events sorted by start time rebuilds the tree.

A device activity is attributed through its launch: activity and runtime launch share a
``correlation`` id; the launch happened on a CPU thread at a time that falls inside exactly one
top-level operator of that thread.  When no launch is recorded, the activity's ``External id``
names the operator running at launch, whose top-level ancestor gets it.  Activities under a
collective (``c10d::``, ``_c10d_functional::``, NCCL kernels) are communication, and host<->device
copies are transfers, not kernels; both are counted and left out, as are activities no operator
launched (reported as unattributed).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from perf_plugin.trace.events import DeviceActivity, Launch, TraceData, TraceOp

_OPERATOR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_.]*$")
NON_OPERATOR_NAMESPACES = frozenset({"autograd", "profiler", "ProfilerStep", "cuda", "torch"})
COMMUNICATION_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_dtensor", "nccl"})
_TRANSFER = re.compile(r"\b(HtoD|DtoH|HtoH|Host|Pageable|Pinned)\b", re.IGNORECASE)


def namespace(name: str) -> str:
    return name.split("::", 1)[0] if "::" in name else ""


def is_operator(name: str) -> bool:
    return bool(_OPERATOR_NAME.match(name)) and namespace(name) not in NON_OPERATOR_NAMESPACES


def is_communication_op(name: str) -> bool:
    return namespace(name) in COMMUNICATION_NAMESPACES


def is_communication_kernel(name: str) -> bool:
    return name.lower().startswith("nccl") or "nccl" in name.split("(")[0].lower()


@dataclass
class OpSample:
    """One execution of a top-level operator and the device time attributed to it."""

    op: TraceOp
    device_ns: int = 0
    activities: int = 0
    kernels: list[str] = field(default_factory=list)  # names of the device activities, in launch order
    kernel_ns: dict[str, int] = field(default_factory=dict)  # device time per activity name
    # whether the operator's first device activity was launched when the device had finished all
    # earlier work (None: no launch recorded for it)
    launched_idle: bool | None = None

    def descendants(self) -> list[TraceOp]:
        return self.op.descendants()


@dataclass
class Attribution:
    samples: list[OpSample]
    device_trace: bool
    communication: Counter[str] = field(default_factory=Counter)
    transfers: int = 0
    unattributed: Counter[str] = field(default_factory=Counter)


def build_tree(ops: list[TraceOp]) -> list[TraceOp]:
    """Link children/parents by time nesting per thread; return the top-level operators."""
    by_thread: dict[tuple[int, int], list[TraceOp]] = defaultdict(list)
    for op in ops:
        by_thread[op.thread].append(op)
    top_level: list[TraceOp] = []
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda o: (o.start_ns, -o.end_ns))
        stack: list[TraceOp] = []
        for op in thread_ops:
            while stack and op.start_ns >= stack[-1].end_ns:
                stack.pop()
            if stack:
                op.parent = stack[-1]
                stack[-1].children.append(op)
            stack.append(op)
    for op in ops:
        if not is_operator(op.name):
            continue
        ancestor = op.parent
        while ancestor is not None and not is_operator(ancestor.name):
            ancestor = ancestor.parent
        if ancestor is None:
            top_level.append(op)
    top_level.sort(key=lambda o: (o.start_ns, o.thread))
    return top_level


def _top_level_of(op: TraceOp) -> TraceOp:
    top = op
    node = op.parent
    while node is not None:
        if is_operator(node.name):
            top = node
        node = node.parent
    return top


def attribute(trace: TraceData) -> Attribution:
    top_level = build_tree(trace.ops)
    samples = {id(op): OpSample(op) for op in top_level}
    attribution = Attribution([samples[id(op)] for op in top_level], device_trace=bool(trace.activities))

    intervals: dict[tuple[int, int], tuple[list[int], list[TraceOp]]] = {}
    for op in top_level:
        starts, owners = intervals.setdefault(op.thread, ([], []))
        starts.append(op.start_ns)
        owners.append(op)
    for starts, owners in intervals.values():
        order = sorted(range(len(starts)), key=starts.__getitem__)
        starts[:] = [starts[i] for i in order]
        owners[:] = [owners[i] for i in order]
    launches: dict[int, Launch] = {
        launch.correlation: launch for launch in trace.launches if launch.correlation is not None
    }
    ops_by_external: dict[int, TraceOp] = {}
    for op in trace.ops:
        if op.external_id is not None and is_operator(op.name):
            ops_by_external.setdefault(op.external_id, op)

    def owner_at(thread: tuple[int, int], time_ns: int) -> TraceOp | None:
        if thread not in intervals:
            return None
        starts, owners = intervals[thread]
        position = bisect.bisect_right(starts, time_ns) - 1
        if position >= 0 and time_ns < owners[position].end_ns:
            return owners[position]
        return None

    idle = idle_launches(trace.activities, launches)
    for index, activity in enumerate(trace.activities):
        owner = _owner(activity, launches, ops_by_external, owner_at)
        if is_communication_kernel(activity.name) or (owner is not None and _under_communication(owner)):
            attribution.communication[_communication_label(owner, activity)] += 1
            continue
        if activity.category != "kernel" and _TRANSFER.search(activity.name):
            attribution.transfers += 1
            continue
        if owner is None or id(owner) not in samples:
            attribution.unattributed[activity.name.split("(")[0][:80]] += 1
            continue
        sample = samples[id(owner)]
        if sample.activities == 0:
            sample.launched_idle = idle.get(index)
        sample.device_ns += activity.duration_ns
        sample.activities += 1
        sample.kernels.append(activity.name)
        sample.kernel_ns[activity.name] = sample.kernel_ns.get(activity.name, 0) + activity.duration_ns
    return attribution


def idle_launches(activities: list[DeviceActivity], launches: Mapping[int, Launch]) -> dict[int, bool]:
    """Per activity (its index) with a recorded launch: whether the launch began after every
    activity that started before it on the device had ended.

    A host-bound phase (decode in eager mode) launches each kernel onto an idle device; a
    device-bound one (prefill) queues kernels behind running work.  Which one a kernel ran in
    changes its duration: launched idle after other kernels evicted the cache, a 4096-element
    add takes 1.4 us on an H100, 1.1 us queued (``reproduce/wip/launch_context_effect.py``).
    """
    busy_until = -1
    idle: dict[int, bool] = {}
    for index in sorted(range(len(activities)), key=lambda i: activities[i].start_ns):
        activity = activities[index]
        launch = launches.get(activity.correlation) if activity.correlation is not None else None
        if launch is not None:
            idle[index] = launch.start_ns >= busy_until
        busy_until = max(busy_until, activity.start_ns + activity.duration_ns)
    return idle


def _owner(
    activity: DeviceActivity,
    launches: Mapping[int, Launch],
    ops_by_external: Mapping[int, TraceOp],
    owner_at: Callable[[tuple[int, int], int], TraceOp | None],
) -> TraceOp | None:
    launch = launches.get(activity.correlation) if activity.correlation is not None else None
    if launch is not None:
        owner = owner_at(launch.thread, launch.start_ns)
        if owner is not None:
            return owner
    for external in (activity.external_id, launch.external_id if launch is not None else None):
        if external is not None and external in ops_by_external:
            return _top_level_of(ops_by_external[external])
    return None


def _under_communication(owner: TraceOp) -> bool:
    node: TraceOp | None = owner
    while node is not None:
        if is_communication_op(node.name):
            return True
        node = node.parent
    return False


def _communication_label(owner: TraceOp | None, activity: DeviceActivity) -> str:
    if owner is not None and is_communication_op(owner.name):
        return owner.name
    return activity.name.split("(")[0][:80]
