"""PyTorch profiler traces (CUDA and CPU) -> kernel samples ready for aggregation.

Each execution of a top-level operator is one sample (``trace_attribution``), named and
described by ``aten_mapping``.  Its duration is:

* on a trace with device activity (CUDA): the summed device time of the kernels, memsets and
  device-to-device copies the operator launched (``Accelerator Core`` = ``CUDA``); operators that
  launched nothing on the device are not rows.  The counter ``Launched Idle`` says whether the
  operator's first kernel was launched onto an idle device (``trace_attribution.idle_launches``),
  each input's reuse distance, the bytes the device moved since it was written
  (``input_reuse``), and the counter ``Code Reuse Distance(kernels)`` how many distinct kernels
  ran since its kernels last did, and ``Profiling Code Reuse Distance(B)`` how many bytes the
  device moved in between (``code_reuse``), and the counter ``Recent Write Share`` what share
  of the traffic just before it was writes (``write_share``);
* on a CPU-only trace: the operator's own wall time on the CPU (its ``dur``, which includes the
  operators it called), for operators that do work (views and allocations are left out);
  ``Accelerator Core`` = ``CPU``.

The profile must be taken with ``record_shapes=True``: without input shapes there is nothing to
key a database row on.
"""

from __future__ import annotations

import tempfile
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import CODE_REUSE, DETAIL_COLUMNS, IDENTITY_COLUMNS, LAUNCHED_IDLE, RECENT_WRITE_SHARE
from perf_plugin.ingest import columns as col
from perf_plugin.ingest.aggregate import (
    CAPTURED_COLUMNS,
    CODE_REUSE_BYTES,
    INPUT_DEPTHS,
    INPUT_MASKED,
    INPUT_QUANTILES,
    INPUT_ZEROS,
    INPUT_DISTINCT,
    INPUT_REUSE,
    INPUT_REUSE_SPREAD,
    INPUT_BLOCK_REUSE,
    KERNEL_TIMES,
)
from perf_plugin.ingest.aten_mapping import does_work, map_operator
from perf_plugin.ingest.code_reuse import code_reuse_bytes, code_reuse_distances
from perf_plugin.ingest.execution_trace import ExecutionTrace, execution_trace_for, storages_of
from perf_plugin.ingest.input_reuse import input_reuse
from perf_plugin.ingest.input_values import ValuesAttachment, attach_values, values_for_trace
from perf_plugin.ingest.tensor_lifetimes import release_times
from perf_plugin.ingest.traced_lists import complete_tensor_lists, has_lists_to_complete
from perf_plugin.ingest.list_dtypes import (
    READERS_LOOKED_AT,
    resolve_cat_dtypes,
    trace_dtypes_by_shape,
    trace_dtypes_by_size,
)
from perf_plugin.ingest.profile_table import ProfileTable
from perf_plugin.ingest.trace_attribution import (
    OpSample,
    attribute,
    is_communication_op,
)
from perf_plugin.ingest.trace_events import read_chrome_trace, read_profiler
from perf_plugin.ingest.write_share import recent_write_shares
from perf_plugin.trace.events import MemoryEvent, TraceData, TraceOp
from perf_plugin.trace.mapped import MappedOp
from perf_plugin.trace.values_file import CapturedValues

KIND_TORCH_TRACE = "torch_trace"
CORE_CUDA = "CUDA"
CORE_CPU = "CPU"


@dataclass
class TraceSummary:
    """What a trace held besides the samples, for the ingest report."""

    device_trace: bool
    device_name: str | None = None
    operators: int = 0
    samples: int = 0
    transfers: int = 0
    unattributed: Counter[str] = field(default_factory=Counter)
    unknown_dtype_rows: int = 0
    no_output_rows: int = 0
    values: ValuesAttachment | None = None  # what an input-value capture gave the trace
    # device samples' input tensors an execution trace named, of all of them (None: no execution trace)
    named_inputs: tuple[int, int] | None = None

    @property
    def accelerator_core(self) -> str:
        return CORE_CUDA if self.device_trace else CORE_CPU


def trace_samples(trace: TraceData, execution: ExecutionTrace | None = None) -> tuple[ProfileTable, TraceSummary]:
    """The trace's samples; ``execution`` (its execution trace) names the tensors each read."""
    if not trace.ops:
        raise DatabaseError("the trace holds no CPU operators (cat 'cpu_op')", path=trace.source)
    if not trace.has_shapes:
        raise DatabaseError(
            "the trace has no input shapes: profile with torch.profiler.profile(record_shapes=True)",
            path=trace.source,
        )
    attribution = attribute(trace)
    summary = TraceSummary(attribution.device_trace, trace.device_name, transfers=attribution.transfers,
                           unattributed=attribution.unattributed)
    communication: Counter[str] = Counter(attribution.communication)
    records: list[dict[str, Any]] = []
    launched: list[tuple[TraceOp, dict[str, Any], MappedOp]] = []  # device samples: operator, record, row
    following = _following_on_thread(attribution.samples)
    trace_dtypes = (trace_dtypes_by_size(trace.ops), trace_dtypes_by_shape(trace.ops))  # a cat's evidence
    for sample in attribution.samples:
        summary.operators += 1
        op = sample.op
        if is_communication_op(op.name):
            if not attribution.device_trace:
                communication[op.name] += 1
            continue
        descendants = sample.descendants()
        if attribution.device_trace:
            if sample.activities == 0:
                continue
            duration_us = sample.device_ns / 1000.0
        else:
            if not does_work(op, descendants):
                continue
            duration_us = op.duration_ns / 1000.0
        mapped = resolve_cat_dtypes(map_operator(op, descendants), sample, following(sample), *trace_dtypes)
        cells = mapped.cells(summary.accelerator_core)
        if any(slot.shape is not None and not slot.dtype for slot in (*mapped.inputs, *mapped.outputs)):
            summary.unknown_dtype_rows += 1
        if not mapped.outputs:
            summary.no_output_rows += 1
        record = {col.TYPE: mapped.kernel_type, **cells, col.DURATION: duration_us, INPUT_QUANTILES: op.quantiles,
                  INPUT_DEPTHS: op.depths, INPUT_ZEROS: op.zeros, INPUT_MASKED: op.masked, INPUT_DISTINCT: op.distinct}
        if attribution.device_trace:
            record[KERNEL_TIMES] = sample.kernel_ns
            record[LAUNCHED_IDLE] = float("nan") if sample.launched_idle is None else float(sample.launched_idle)
            launched.append((op, record, mapped))
        records.append(record)
    summary.samples = len(records)
    summary.named_inputs = _record_reuse(launched, trace.memory, execution)
    table = ProfileTable(
        frame=_sample_frame(records, attribution.device_trace),
        counters=[LAUNCHED_IDLE, CODE_REUSE, RECENT_WRITE_SHARE] if attribution.device_trace else [],
        sources=[trace.source] if trace.source is not None else [],
        kinds=[KIND_TORCH_TRACE],
        rows_read=summary.operators,
        communication=communication,
    )
    return table, summary


def _record_reuse(
    launched: list[tuple[TraceOp, dict[str, Any], MappedOp]], memory: list[MemoryEvent], execution: ExecutionTrace | None
) -> tuple[int, int] | None:
    """Each device sample's inputs' reuse distances and its code's, over the samples in launch
    order (a sample's kernels are those of its ``KERNEL_TIMES``, in the order they first ran);
    the allocator's events, where the profile has them, rule out released producers, and an
    execution trace names the tensors.  Returns the input tensors it named, of all (None without one)."""
    launched.sort(key=lambda item: item[0].start_ns)
    released = release_times([(op, mapped) for op, _, mapped in launched], memory) if memory else None
    storages = [storages_of(mapped, op, execution) for op, _, mapped in launched] if execution is not None else None
    reuse = input_reuse([mapped for _, _, mapped in launched], [op.start_ns for op, _, _ in launched], released, storages)
    kernels = [list(record[KERNEL_TIMES]) for _, record, _ in launched]
    code = code_reuse_distances(kernels)
    ops = [mapped for _, _, mapped in launched]
    code_bytes = code_reuse_bytes(kernels, ops)
    for (_, record, _), per_slot, spread, block, code_distance, code_moved, write_share in zip(
        launched, reuse.distances, reuse.spreads, reuse.block_reuse, code, code_bytes, recent_write_shares(ops)
    ):
        record[INPUT_REUSE] = per_slot
        record[INPUT_REUSE_SPREAD] = spread
        record[INPUT_BLOCK_REUSE] = block
        record[CODE_REUSE] = code_distance
        record[CODE_REUSE_BYTES] = code_moved
        record[RECENT_WRITE_SHARE] = write_share
    if storages is None:
        return None
    named = [storage for known in storages if known is not None for storage in known.inputs]
    slots = sum(1 for _, _, mapped in launched for slot in mapped.inputs if slot.shape is not None)
    return sum(1 for storage in named if storage is not None), slots


def _following_on_thread(samples: list[OpSample]) -> Callable[[OpSample], list[OpSample]]:
    """The operators that ran after a sample on its thread, nearest first."""
    by_thread: dict[tuple[int, int], list[OpSample]] = {}
    for sample in sorted(samples, key=lambda s: s.op.start_ns):
        by_thread.setdefault(sample.op.thread, []).append(sample)
    position = {id(sample): index for ordered in by_thread.values() for index, sample in enumerate(ordered)}

    def after(sample: OpSample) -> list[OpSample]:
        ordered = by_thread[sample.op.thread]
        start = position[id(sample)] + 1
        return ordered[start : start + READERS_LOOKED_AT]

    return after


def _sample_frame(records: list[dict[str, Any]], device_trace: bool) -> pd.DataFrame:
    """The samples as ingest's frame: cells as categories (few distinct values, many samples)."""
    columns = [col.TYPE, *IDENTITY_COLUMNS, *DETAIL_COLUMNS, col.DURATION]
    if device_trace:
        columns += [KERNEL_TIMES, LAUNCHED_IDLE, CODE_REUSE, RECENT_WRITE_SHARE, INPUT_REUSE, INPUT_REUSE_SPREAD,
                    INPUT_BLOCK_REUSE, CODE_REUSE_BYTES]
    # where a capture recorded some (top-k's input)
    columns += [name for name in CAPTURED_COLUMNS if any(record[name] for record in records)]
    frame = pd.DataFrame.from_records(records, columns=columns)
    for name in (col.TYPE, *IDENTITY_COLUMNS, *DETAIL_COLUMNS):
        frame[name] = frame[name].astype("category")
    frame[col.DURATION] = frame[col.DURATION].astype("float64")
    return frame


def read_trace_file(
    path: str | Path, values_path: Path | None = None, execution_path: Path | None = None
) -> tuple[ProfileTable, TraceSummary]:
    """The samples of a trace file, with the input values of ``values_path`` (default: the
    ``<trace>.values.json`` beside it, where there is one) attached to their calls, and the
    tensors of ``execution_path`` (default: the ``<trace>.et.json`` beside it) naming their inputs
    and completing their tensor lists.  The one beside a trace without device activity is read
    only where it has a tensor list to complete: only the device's reuse distances use the rest."""
    trace = read_chrome_trace(path)
    wanted = bool(trace.activities) or execution_path is not None or has_lists_to_complete(trace.ops)
    execution = execution_trace_for(Path(path), execution_path) if wanted else None
    if execution is not None:
        complete_tensor_lists(trace.ops, execution)
    return _with_values(trace, values_for_trace(Path(path), values_path), execution)


def _with_values(
    trace: TraceData, captured: CapturedValues | None, execution: ExecutionTrace | None = None
) -> tuple[ProfileTable, TraceSummary]:
    attachment = attach_values(trace, captured) if captured is not None else None
    table, summary = trace_samples(trace, execution)
    summary.values = attachment
    return table, summary


def live_events_record_strides() -> bool:
    """Whether this torch's profiler events carry input strides and the shapes of tensor lists
    (``structured_input_strides``, newer releases); its exported traces always do."""
    import torch

    return hasattr(torch._C._autograd._KinetoEvent, "structured_input_strides")


def read_live_profiler(profiler: Any, captured: CapturedValues | None = None) -> tuple[ProfileTable, TraceSummary]:
    """The samples of a finished profiler, the same as those of its exported trace, with the
    values ``captured`` (an input-value capture's) attached to their calls.

    Where the live events lack strides (torch releases before ``structured_input_strides``), the
    profile is read through an exported trace instead: read live, a transposed operand would
    become a contiguous row and replay another kernel than the model ran.
    """
    if live_events_record_strides():
        return _with_values(read_profiler(profiler), captured)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "trace.json"
        try:
            profiler.export_chrome_trace(str(path))
        except RuntimeError:  # a profile exports once ("Trace is already saved")
            warnings.warn(
                "this torch's profiler events record no strides and the profile was already "
                "exported: ingest the exported trace file to keep them (rows read now are contiguous)",
                stacklevel=3,
            )
            return _with_values(read_profiler(profiler), captured)
        return _with_values(read_chrome_trace(path), captured)

