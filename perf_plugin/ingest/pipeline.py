"""Ingest end to end: find the profile, read it, aggregate, merge into the database.

``ingest_path`` serves ``perfdb ingest``; ``ingest_profiler`` takes a finished
``torch.profiler.profile`` object directly (a model profiled in process becomes database rows
without a trace file in between).  Both return an ``IngestReport`` whose ``lines()`` is what
the command prints.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.ingest import discover as disc
from perf_plugin.ingest.aggregate import AggregatedRow, aggregate
from perf_plugin.ingest.ascend_values import AscendValues, read_kernel_tables
from perf_plugin.ingest.fia_bundle import KERNEL_TYPE as FIA_KERNEL_TYPE
from perf_plugin.ingest.fia_bundle import FiaBundle, check_bundle, with_bundle_cells
from perf_plugin.ingest.merge import MergeResult, group_by_type, merge_into_database, validate_types
from perf_plugin.ingest.profile_table import ProfileTable, combine, read_profile_table
from perf_plugin.ingest.torch_trace import TraceSummary, read_live_profiler, read_trace_file
from perf_plugin.ingest.value_sources import ValueSources, with_value_sources
from perf_plugin.trace.values_file import CapturedValues
from perf_plugin.replay.registry import refresh_catalog


@dataclass
class IngestReport:
    discovery: disc.Discovery | None
    table: ProfileTable
    rows: list[AggregatedRow]
    merge: MergeResult | None = None
    traces: list[TraceSummary] = field(default_factory=list)
    fia_bundle: FiaBundle | None = None
    value_sources: ValueSources = field(default_factory=ValueSources)
    ascend_values: list[AscendValues] = field(default_factory=list)  # what values files gave kernel_details files

    @property
    def kernel_types(self) -> list[str]:
        return list(dict.fromkeys(row.kernel_type for row in self.rows))

    @property
    def communication(self) -> Counter[str]:
        return self.table.communication

    def lines(self) -> list[str]:
        out: list[str] = []
        if self.discovery is not None:
            out.append(f"input: {len(self.discovery.files)} {self.discovery.kind} file(s)")
            for file in self.discovery.files:
                out.append(f"  {file}")
                for name, found in self.discovery.sidecars.get(file, {}).items():
                    out.append(f"    {name}: {found if found is not None else 'not found'}")
            if self.discovery.ignored:
                out.append(
                    f"  ignored {len(self.discovery.ignored)} other profiler file(s) "
                    f"(the {self.discovery.kind} files describe the same kernels)"
                )
        table = self.table
        out.append(
            f"rows read: {table.rows_read}; compute samples: {table.compute_rows}; "
            f"aggregated rows: {len(self.rows)} in {len(self.kernel_types)} kernel type(s)"
        )
        if table.communication:
            detail = ", ".join(f"{name} x{count}" for name, count in sorted(table.communication.items()))
            total = sum(table.communication.values())
            out.append(f"communication rows left out of the compute CSVs: {total} ({detail})")
        if table.without_type:
            out.append(f"rows without a kernel type (Type N/A or empty), skipped: {table.without_type}")
        if table.without_duration:
            out.append(f"rows without a duration, skipped: {table.without_duration}")
        for trace in self.traces:
            out.extend(_trace_lines(trace))
        for attached in self.ascend_values:
            out.extend(attached.lines())
        out.extend(self.value_sources.lines())
        if self.fia_bundle is not None:
            out.extend(self.fia_bundle.lines())
        if self.merge is not None:
            out.append(f"database: {self.merge.directory}")
            for change in self.merge.files:
                state = "created" if change.created else ("updated" if change.rewritten else "unchanged")
                out.append(
                    f"  {change.path.name}: {state} (appended {change.appended}, updated {change.updated}, "
                    f"unchanged {change.unchanged})"
                )
        return out


def _trace_lines(trace: TraceSummary) -> list[str]:
    """The report's lines on one PyTorch trace."""
    out: list[str] = []
    where = f"{trace.device_name or 'device'} kernels" if trace.device_trace else "CPU operator time"
    out.append(f"trace: {trace.operators} top-level operators, {trace.samples} samples ({where})")
    if trace.transfers:
        out.append(f"  host<->device transfers left out: {trace.transfers}")
    if trace.unattributed:
        out.append(
            f"  device activities launched outside any operator, left out: {sum(trace.unattributed.values())}"
        )
    if trace.no_output_rows:
        out.append(
            f"  samples whose outputs the trace does not determine (output cells empty): {trace.no_output_rows}"
        )
    if trace.unknown_dtype_rows:
        out.append(
            f"  samples with a dtype the trace does not record (tensor lists): {trace.unknown_dtype_rows}"
        )
    if trace.values is not None:
        out.extend(trace.values.lines())
    if trace.named_inputs is not None:
        named, slots = trace.named_inputs
        out.append(f"  execution trace: {named} of {slots} device samples' input tensors named by storage")
    return out


def read_inputs(
    discovery: disc.Discovery, input_values: Path | None = None, execution_trace: Path | None = None
) -> tuple[ProfileTable, list[TraceSummary], list[AscendValues]]:
    """The profile's samples; input values come from ``input_values`` (one PyTorch trace, or any
    kernel_details files, whose ranges' token picks the calls) or from the values files beside
    each trace (``<trace>.values.json``) or near each Ascend profile; the tensors a trace's
    inputs were, from ``execution_trace`` (one PyTorch trace) or the ``<trace>.et.json`` beside it."""
    if execution_trace is not None and (discovery.kind != disc.TORCH_TRACE or len(discovery.files) != 1):
        raise _not_one_trace("--execution-trace", execution_trace, discovery, "<trace>.et.json")
    if input_values is not None and discovery.kind == disc.OP_SUMMARY:
        raise DatabaseError("--input-values needs the capture's ranges, which an msprof op_summary profile does not "
                            "hold: ingest the torch_npu profile directory (kernel_details.csv, trace_view.json)",
                            path=input_values)
    if input_values is not None and discovery.kind == disc.TORCH_TRACE and len(discovery.files) != 1:
        raise _not_one_trace("--input-values", input_values, discovery, "<trace>.values.json")
    if discovery.kind == disc.TORCH_TRACE:
        tables, summaries = [], []
        for file in discovery.files:
            table, summary = read_trace_file(file, input_values, execution_trace)
            tables.append(table)
            summaries.append(summary)
        return combine(tables), summaries, []
    if discovery.kind == disc.KERNEL_DETAILS:
        table, attached = read_kernel_tables(discovery, input_values)
        return table, [], attached
    return combine([read_profile_table(file) for file in discovery.files]), [], []


def _not_one_trace(option: str, path: Path, discovery: disc.Discovery, beside: str) -> DatabaseError:
    """The error for a file given for one PyTorch trace, to a profile that is not one."""
    return DatabaseError(f"{option} belongs to one PyTorch trace; the profile holds {len(discovery.files)} "
                         f"{discovery.kind} file(s) (a trace finds its own {beside} beside it)", path=path)


def ingest_path(
    profiling_path: str | Path,
    database_dir: str | Path | None,
    input_values: Path | None = None,
    execution_trace: Path | None = None,
) -> IngestReport:
    """Read ``profiling_path`` and merge it into ``database_dir`` (None: read and report only)."""
    refresh_catalog()  # the kernel types installed now name the rows
    discovery = disc.discover(profiling_path)
    table, traces, ascend_values = read_inputs(discovery, input_values, execution_trace)
    rows, sources = with_value_sources(aggregate(table.frame, table.counters))
    validate_types(group_by_type(rows), discovery.files[0] if len(discovery.files) == 1 else None)
    # The FIA bundle check reads the kernel_details files again, only when they hold such kernels.
    bundle = check_bundle(discovery) if any(row.kernel_type == FIA_KERNEL_TYPE for row in rows) else None
    report = IngestReport(discovery, table, with_bundle_cells(rows, bundle), traces=traces, fia_bundle=bundle,
                          value_sources=sources, ascend_values=ascend_values)
    if database_dir is not None:
        report.merge = merge_into_database(database_dir, report.rows)
    return report


def ingest_profiler(
    profiler: Any, database_dir: str | Path | None, input_values: CapturedValues | None = None
) -> IngestReport:
    """Merge the operators of a finished ``torch.profiler.profile`` into ``database_dir``, with
    the values an input-value capture recorded during it (``InputValueCapture.values``)."""
    refresh_catalog()
    table, summary = read_live_profiler(profiler, input_values)
    rows, sources = with_value_sources(aggregate(table.frame, table.counters))
    report = IngestReport(None, table, rows, traces=[summary], value_sources=sources)
    if database_dir is not None:
        report.merge = merge_into_database(database_dir, rows)
    return report
