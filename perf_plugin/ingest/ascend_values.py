"""Attach an input-value capture's values to the kernel rows of an Ascend profile.

A model profiled with ``torch_npu.profiler`` and ``perf_plugin.capture.capture_input_values``
leaves two things: the profile directory, whose ``trace_view.json`` holds each capture range
``perf_values/<token>/<n>`` as a framework operator (torch_npu's profiler records every
``RecordFunction`` scope, user scopes included, as a ``cpu_op`` event named as the range), and
the values file the capture wrote (``perf_plugin.trace.values_file``).  A script names the
values file before torch_npu names the profile directory (``<host>_<pid>_<time>_ascend_pt``), so
it is looked for as any ``*.values.json`` in the profile's ``ASCEND_PROFILER_OUTPUT``, in the
profile directory, or in the directory holding it (the one given to
``tensorboard_trace_handler``); the tokens its ranges carry say which file is this profile's
(other ranks' files lie there too).  ``--input-values`` names the file instead.

Each kernel of a type whose time depends on values (``OpReplay.data_inputs``: ``GroupedMatmul``'s
group list) is linked to its range the way the FIA bundle check links kernels to operators
(``perf_plugin.ingest.ascend_trace_view``): the kernel_details row's start time is the device
task's ``ts``, its ``torch_to_npu`` flow leads back to the launching operator on the Python
thread, and the innermost capture range holding that launch is the call.  The values go to the
row's data slot that holds a tensor of as many elements (the ``[E]`` group list: slot 7 of
``GroupedMatmul``, 4 or 5 of ``GroupedMatmulSwigluQuant``; a TND ``FlashAttentionScore``'s
``actual_seq_qlen`` and ``actual_seq_kvlen``, slots 8 and 9, in the call's argument order;
``MoeTokenPermute``'s ``[T, k]`` expert ids and ``MoeTokenUnpermute``'s ``[T*k]`` sorted indices,
slot 1), as the row's ``Input Values`` cell.
A kernel type whose replay draws a floating input from quantiles (``OpReplay.quantile_inputs``:
``TopKV2``'s ``x``) takes the quantiles the capture recorded of the call's argument of the same
position (``torch.topk``'s input), aggregated per row as ``Profiling Input Quantiles``; one whose
replay zeroes a recorded share of an input (``OpReplay.zero_share_inputs``: ``RealDiv``'s two)
takes the shares of zero elements it recorded (``torch.div``'s operands), aggregated per row as
``Profiling Input Zero Shares``; one whose replay masks an input (``OpReplay.masked_inputs``:
``SoftmaxV2``'s logits) takes the masked share and runs it recorded (``torch.softmax``'s input),
aggregated per row as ``Profiling Input Masked Shares``.
Kernels are keyed by start time and name, the pair a kernel_details row and its device task share.

Written against torch_npu's profiler formats (the public Level1 profile's trace_view.json and
torch_npu's trace event writer); never run on a profile of an NPU that ran the capture.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.shapes import QuoteStyle, SlotShape, format_shape_cell, parse_shape_cell
from perf_plugin.ingest import discover as disc
from perf_plugin.ingest.ascend_trace_view import OPERATOR_CATEGORY, launching_operators, read_events, to_ns
from perf_plugin.ingest.fia_bundle import TORCH_OUTPUT_DIR
from perf_plugin.ingest.names import normalise_kernel_type
from perf_plugin.ingest.profile_table import START_TIME, KernelKey, ProfileTable, combine, read_profile_table
from perf_plugin.replay.registry import get_replay
from perf_plugin.trace.values_file import SUFFIX, CapturedCall, CapturedValues, parse_mark, read_values_file


@dataclass(frozen=True)
class DataKernel:
    """A kernel_details row of a kernel type whose time depends on input values."""

    key: KernelKey
    kernel_type: str
    slots: list[SlotShape]  # its input shapes
    data_slots: tuple[int, ...]  # the slots its replay reads values for
    quantile_slots: tuple[int, ...] = ()  # the slots its replay draws from quantiles
    zero_slots: tuple[int, ...] = ()  # the slots whose recorded share of zero elements its replay zeroes
    masked_slots: tuple[int, ...] = ()  # the slots whose recorded masked share and runs its replay masks


@dataclass
class Linked:
    """What linking gave the kernels of one profile: ``Input Values`` cells, and quantiles of
    floating inputs by slot (``Profiling Input Quantiles``, aggregated per row at ingest)."""

    values: dict[KernelKey, str] = field(default_factory=dict)
    quantiles: dict[KernelKey, dict[int, tuple[float, ...]]] = field(default_factory=dict)
    depths: dict[KernelKey, dict[int, dict[int, int]]] = field(default_factory=dict)  # top-k's selection depths
    zeros: dict[KernelKey, dict[int, float]] = field(default_factory=dict)  # a division's zero shares
    masked: dict[KernelKey, dict[int, tuple[float, float]]] = field(default_factory=dict)  # a softmax's masks


@dataclass
class AscendValues:
    """What the values files gave one kernel_details file, for the ingest report."""

    kernel_details: Path
    sources: list[Path] = field(default_factory=list)
    captured: int = 0  # calls in the values files of this profile
    attached: int = 0  # calls whose values went to a kernel row
    kernels: int = 0  # kernel launches given values
    other_capture: int = 0  # ranges of a token no values file has
    without_entry: int = 0  # ranges of a known capture with no entry in its file
    without_kernel: int = 0  # ranges that launched no kernel of a type with data inputs
    without_slot: int = 0  # such kernels whose row has no slot of the values' length
    without_values: int = 0  # such kernels whose call recorded no values
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        where = f" ({', '.join(str(p) for p in self.sources)})" if self.sources else ""
        out = [f"input values for {self.kernel_details}{where}: {self.attached} of {self.captured} captured "
               f"call(s) attached, to {self.kernels} kernel launch(es)"]
        for count, what in ((self.other_capture, "ranges of another capture (no values file has their token), ignored"),
                            (self.without_entry, "ranges with no entry in the values file"),
                            (self.without_kernel, "ranges that launched no kernel whose time depends on values"),
                            (self.without_slot, "kernels whose row has no data slot (group list, sequence lengths) of the values' length"),
                            (self.without_values, "kernels whose call recorded no values (no group list, no quantiles)")):
            if count:
                out.append(f"    {what}: {count}")
        out.extend(f"    {problem}" for problem in self.problems)
        if self.attached < self.captured and not self.problems:
            out.append("    calls missing from the profile: the capture must run inside the profiled region")
        return out


def values_files_near(kernel_details: Path) -> list[Path]:
    """``*.values.json`` in the profile's output directory, the profile directory and the one holding it."""
    output = kernel_details.parent
    profile = output.parent if output.name == TORCH_OUTPUT_DIR else output
    folders = dict.fromkeys((output, profile, profile.parent))
    return sorted(p for folder in folders for p in folder.glob("*" + SUFFIX) if p.is_file())


def read_data_kernels(path: Path) -> list[DataKernel]:
    """The rows of kernel types whose replay reads input values (``OpReplay.data_inputs``),
    draws inputs from quantiles (``OpReplay.quantile_inputs``), zeroes a recorded share of
    them (``OpReplay.zero_share_inputs``) or masks them (``OpReplay.masked_inputs``)."""
    kernels: list[DataKernel] = []
    data_slots: dict[str, tuple[tuple[int, ...], ...]] = {}
    try:
        with path.open("r", encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            names = {name.strip(): name for name in reader.fieldnames or []}
            for cells in reader:
                kernel_type = normalise_kernel_type(cells.get(names.get("Type", "Type")) or "")
                if kernel_type not in data_slots:
                    replay = get_replay(kernel_type)
                    data_slots[kernel_type] = ((tuple(replay.data_inputs), replay.quantile_inputs,
                                                replay.zero_share_inputs, replay.masked_inputs)
                                               if replay is not None else ((), (), (), ()))
                start = to_ns(cells.get(names.get(START_TIME, START_TIME)))
                if not any(data_slots[kernel_type]) or start is None:
                    continue
                name = (cells.get(names.get("Name", "Name")) or "").strip()
                shapes = _slots(cells.get(names.get("Input Shapes", "")) or "")
                kernels.append(DataKernel((start, name), kernel_type, shapes, *data_slots[kernel_type]))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DatabaseError(f"cannot read it for input values: {exc}", path=path) from None
    return kernels


def _slots(cell: str) -> list[SlotShape]:
    try:
        return parse_shape_cell(cell)
    except DatabaseError:
        return []  # a malformed cell has no slot to hold values; ingest reports the row elsewhere


def values_cell(kernel: DataKernel, call: CapturedCall) -> str | None:
    """The row's ``Input Values`` cell: the call's recorded arguments, in argument order, each in
    the first data slot left, in slot order, that holds a tensor of as many elements (a grouped
    GEMM's one group list; flash attention's query lengths in slot 8, then its KV lengths in slot
    9; the token permutation's ``[T, k]`` expert ids, flattened); None when an argument finds no
    such slot."""
    free = [slot for slot in sorted(kernel.data_slots) if slot < len(kernel.slots)]
    placed: dict[int, tuple[int, ...]] = {}
    for _, values in sorted(call.values.items()):
        slot = next((s for s in free if _elements(kernel.slots[s]) == len(values)), None)
        if slot is None:
            return None
        free.remove(slot)
        placed[slot] = values
    if not placed:
        return None
    return format_shape_cell([placed.get(i) for i in range(max(placed) + 1)], QuoteStyle.EMBEDDED)


def _elements(shape: SlotShape) -> int | None:
    """How many elements a slot's tensor holds (None for an empty slot)."""
    return None if shape is None else math.prod(shape)


def _marks(events: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """The capture ranges of a trace: name -> (token, key)."""
    marks = {}
    for event in events:
        if event.get("ph") == "X" and event.get("cat") == OPERATOR_CATEGORY:
            name = str(event.get("name", ""))
            parsed = parse_mark(name)
            if parsed is not None:
                marks[name] = parsed
    return marks


def link_values(report: AscendValues, kernels: list[DataKernel], events: list[dict[str, Any]],
                captured: Mapping[str, CapturedValues]) -> Linked:
    """Each linked kernel's ``Input Values`` cell and quantiles; ``report`` counts what was and
    was not linked."""
    ranges = launching_operators(events, [k.key[0] for k in kernels], lambda name: parse_mark(name) is not None)
    linked = Linked()
    launched: set[str] = set()
    attached: set[str] = set()
    for kernel in kernels:
        found = ranges.get(kernel.key[0])
        mark = parse_mark(found.name) if found is not None else None
        call = captured[mark[0]].calls.get(mark[1]) if mark is not None and mark[0] in captured else None
        if found is None or call is None:
            continue
        launched.add(found.name)
        cell = values_cell(kernel, call) if call.values else None
        floating = {slot: call.quantiles[slot] for slot in kernel.quantile_slots if slot in call.quantiles}
        zeros = {slot: call.zeros[slot] for slot in kernel.zero_slots if slot in call.zeros}
        masked = {slot: call.masked[slot] for slot in kernel.masked_slots if slot in call.masked}
        if cell is None and not floating and not zeros and not masked:
            report.without_slot += bool(call.values)
            report.without_values += not call.values
            continue
        if cell is not None:
            linked.values[kernel.key] = cell
        if floating:
            linked.quantiles[kernel.key] = floating
        if zeros:
            linked.zeros[kernel.key] = zeros
        if masked:
            linked.masked[kernel.key] = masked
        selected = {slot: call.depths[slot] for slot in kernel.quantile_slots if slot in call.depths}
        if selected:
            linked.depths[kernel.key] = selected
        attached.add(found.name)
        report.kernels += 1
    for name, (token, key) in _marks(events).items():
        if token not in captured:
            report.other_capture += 1
        elif key not in captured[token].calls:
            report.without_entry += 1
        elif name not in launched:
            report.without_kernel += 1
    report.attached = len(attached)
    return linked


def kernel_values(kernel_details: Path, trace_view: Path | None, files: list[CapturedValues],
                  named: bool = False) -> tuple[Linked, AscendValues | None]:
    """The ``Input Values`` cells and quantiles of one kernel_details file's kernels, from the values ``files``
    whose token its trace's ranges carry, and the report (None: no file of this profile's
    captures was found near it, and none was ``named`` by the user)."""
    report = AscendValues(kernel_details)
    if trace_view is None:
        report.sources, report.captured = [f.source for f in files if f.source], sum(len(f.calls) for f in files)
        report.problems.append("trace_view.json not found beside it: the captured calls cannot be linked to kernels")
        return Linked(), report
    events = read_events(trace_view)
    tokens = {token for token, _ in _marks(events).values()}
    mine = {f.token: f for f in files if f.token in tokens}
    if not mine and not named:
        return Linked(), None  # the values files near it are other profiles' (other ranks'): its rows take defaults
    report.sources = [f.source for f in (mine.values() if mine else files) if f.source is not None]
    report.captured = sum(len(f.calls) for f in (mine.values() if mine else files))
    if not mine:
        report.problems.append("no capture range of trace_view.json carries the values file's token: it was "
                               "written by another run (or the capture ran outside the profiled region)")
        return Linked(), report
    return link_values(report, read_data_kernels(kernel_details), events, mine), report


def read_kernel_tables(discovery: disc.Discovery, explicit: Path | None) -> tuple[ProfileTable, list[AscendValues]]:
    """The samples of every kernel_details file, kernels whose call a capture recorded carrying
    its values (from ``explicit``, else the values files near each profile)."""
    named = [read_values_file(explicit)] if explicit is not None else None
    tables, reports = [], []
    for path in discovery.files:
        files = named if named is not None else [read_values_file(p) for p in values_files_near(path)]
        linked = Linked()
        if files:
            trace_view = discovery.sidecars.get(path, {}).get(disc.ASCEND_TRACE_VIEW)
            linked, report = kernel_values(path, trace_view, files, named=named is not None)
            if report is not None:
                reports.append(report)
        tables.append(read_profile_table(path, linked.values, linked.quantiles, linked.depths, linked.zeros,
                                         linked.masked))
    return combine(tables), reports
