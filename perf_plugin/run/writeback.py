"""Write measured durations back into the database CSVs, once, on the controlling process.

Under the database lock, for every CSV a result or a quarantined case points at:

1. measurements are matched to rows by signature (``perf_plugin.database.signature``); a
   measurement goes to the CSV of the kernel type the profiler reported when that differs from
   the case's own (MatMulV2/V3/Common all replay through ``torch.mm``);
2. mode ``all`` updates every matched row and appends measurements that matched no row (when the
   measurement carries identity cells); ``missing-only`` fills only rows with neither a
   microbench nor a profiling duration and reports unmatched measurements without appending;
3. rows of quarantined cases move to ``{KernelType}.quarantine.csv`` beside the CSV, with the
   reason; the quarantine file is written before the rows leave the main file, so a crash in
   between duplicates a row rather than losing it;
4. ``--perf-prune-empty-duration-rows`` removes rows that still have no valid duration;
5. each file is replaced atomically; untouched files are not rewritten at all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.database.kernel_breakdown import format_breakdown
from perf_plugin.database.lock import database_lock
from perf_plugin.database.quarantine import set_aside
from perf_plugin.database.schema import (
    IDENTITY_COLUMNS,
    MICROBENCH_AVERAGE,
    MICROBENCH_BACKEND,
    MICROBENCH_KERNELS,
    MICROBENCH_STATISTICS,
    MICROBENCH_TIMESTAMP,
    PROFILING_AVERAGE,
    PROFILING_KERNELS,
    ROW_ORIGIN,
    ensure_added_columns,
    ensure_microbench_average_column,
    ensure_microbench_counter_column,
    format_number,
    parse_duration,
    row_has_valid_duration,
)
from perf_plugin.database.signature import signature_text
from perf_plugin.database.table import CsvTable
from perf_plugin.replay.registry import signature_of
from perf_plugin.results import (
    CaseResult,
    FileWriteback,
    GapRow,
    QuarantinedRow,
    SampleStats,
)


@dataclass(frozen=True)
class WritebackRequest:
    directory: Path
    update_mode: str  # "all" | "missing-only"
    prune_empty_duration_rows: bool
    timestamp: str
    lock_timeout: float = 60.0


def _target_file(result: CaseResult) -> str:
    return f"{result.reported_kernel_type}.csv" if result.reported_kernel_type else result.ref.csv_file


def _signature_index(table: CsvTable, kernel_type: str) -> dict[str, list[int]]:
    index: dict[str, list[int]] = defaultdict(list)
    for i in range(len(table)):
        if not table.is_blank(i):
            index[signature_text(signature_of(kernel_type, table.row_dict(i)))].append(i)
    return index


def _write_measurement(table: CsvTable, row: int, result: CaseResult, timestamp: str, shared: dict[str, str]) -> None:
    """Fill a row's measurement columns; ``shared`` holds one object per distinct text written:
    rounded to a few decimals, small kernels' statistics repeat across thousands of rows."""

    def put(column: str, text: str) -> None:
        table.set(row, column, shared.setdefault(text, text))

    stats = SampleStats.of(result.samples_us)
    for column, statistic in MICROBENCH_STATISTICS.items():  # the statistic each column holds
        put(column, format_number(stats.value(statistic)))
    put(MICROBENCH_BACKEND, result.backend)
    put(MICROBENCH_TIMESTAMP, timestamp)
    put(MICROBENCH_KERNELS, format_breakdown((k.name, k.mean_us) for k in result.kernels))
    for counter, value in result.counters.items():
        put(ensure_microbench_counter_column(table, counter), format_number(value))


def _comparable_kernels(table: CsvTable, row: int) -> tuple[str, str]:
    """(profiled, replayed) kernel breakdowns of a row, where both ran on one kind of device: a
    CUDA profile's kernels say nothing about a CPU replay's operators."""
    profiled = table.get(row, PROFILING_KERNELS)
    same_device = table.get(row, "Accelerator Core").strip().lower() == table.get(row, MICROBENCH_BACKEND).lower()
    return (profiled, table.get(row, MICROBENCH_KERNELS)) if profiled and same_device else ("", "")


def _prepare_columns(table: CsvTable) -> None:
    ensure_microbench_average_column(table)
    ensure_added_columns(table)


def write_back(
    request: WritebackRequest,
    results: Iterable[CaseResult],
    quarantined: Iterable[QuarantinedRow],
    scope: Iterable[str] = (),
) -> tuple[list[FileWriteback], list[GapRow]]:
    """Apply results and quarantines; ``scope`` names the CSV files the run selected (pruned too)."""
    by_file: dict[str, list[CaseResult]] = defaultdict(list)
    for result in results:
        if result.has_duration:
            by_file[_target_file(result)].append(result)
    quarantine_by_file: dict[str, list[QuarantinedRow]] = defaultdict(list)
    for row in quarantined:
        quarantine_by_file[row.ref.csv_file].append(row)

    summaries: list[FileWriteback] = []
    gaps: list[GapRow] = []
    with database_lock(request.directory, request.lock_timeout):
        files = set(by_file) | set(quarantine_by_file)
        if request.prune_empty_duration_rows:
            files |= {f for f in scope if (request.directory / f).exists()}
        for csv_file in sorted(files):
            summary, file_gaps = _write_file(
                request, csv_file, by_file.get(csv_file, []), quarantine_by_file.get(csv_file, [])
            )
            summaries.append(summary)
            gaps.extend(file_gaps)
    return summaries, gaps


def _write_file(
    request: WritebackRequest,
    csv_file: str,
    results: list[CaseResult],
    quarantined: list[QuarantinedRow],
) -> tuple[FileWriteback, list[GapRow]]:
    path = request.directory / csv_file
    kernel_type = Path(csv_file).stem
    summary = FileWriteback(csv_file)
    table = CsvTable.read(path) if path.exists() else CsvTable.new(IDENTITY_COLUMNS)
    index = _signature_index(table, kernel_type)
    # each row's signature as the index computed it (identity cells are never written here);
    # rows appended for unmatched measurements are added by _apply_results
    key_of = {i: key for key, rows in index.items() for i in rows}
    touched = _apply_results(table, index, key_of, results, request, summary)

    def row_key(i: int) -> str:
        key = key_of.get(i)
        return key if key is not None else signature_text(signature_of(kernel_type, table.row_dict(i)))

    doomed = _rows_to_quarantine(table, quarantined, touched, row_key)
    if doomed:
        set_aside(request.directory, csv_file, table, doomed, request.timestamp)
        summary.rows_quarantined = len(doomed)
    gaps = [_gap_row(table, csv_file, i, row_key(i)) for i in sorted(touched)]

    remove = {i for i, _ in doomed}
    if request.prune_empty_duration_rows:
        pruned = {
            i
            for i in range(len(table))
            if i not in remove and not table.is_blank(i) and not row_has_valid_duration(table, i)
        }
        summary.rows_pruned = len(pruned)
        remove |= pruned
    if remove:
        table.delete_rows(remove)
    if table.changed:
        table.write(path)
        summary.written = True
    return summary, gaps


def _apply_results(
    table: CsvTable,
    index: dict[str, list[int]],
    key_of: dict[int, str],
    results: list[CaseResult],
    request: WritebackRequest,
    summary: FileWriteback,
) -> set[int]:
    """Write each result into the rows of its signature (appending one in update mode ``all``
    when none matches and the result names its kernel); returns the rows written."""
    touched: set[int] = set()
    shared: dict[str, str] = {}
    columns_ready = False
    # Rows that share a signature (a MatMul with the weight transposed or not: one M, K, N) are
    # each measured by their own case: a case's result goes to its own row, not to all of them.
    # Found by line, not by scanning the signature's rows: a file of many rows of one signature
    # would make write-back quadratic (100,000 such rows took over 15 minutes).
    row_at_line = {table.line_of(r): r for r in range(len(table))}
    for result in results:
        rows = index.get(result.ref.signature_key, [])
        line = result.ref.row_line if _target_file(result) == result.ref.csv_file else None
        own = row_at_line.get(line) if line is not None else None
        if own is not None and key_of.get(own) == result.ref.signature_key:
            rows = [own]
        if request.update_mode == "missing-only":
            rows = [r for r in rows if not row_has_valid_duration(table, r) or r in touched]
        if not rows:
            if request.update_mode == "all" and result.identity:
                new_row = table.append_row({**result.identity, ROW_ORIGIN: f"measured:{result.backend}"})
                index[result.ref.signature_key].append(new_row)
                key_of[new_row] = result.ref.signature_key
                rows = [new_row]
                summary.rows_appended += 1
            else:
                summary.unmatched_samples.append(result.ref.case_id)
                continue
        if not columns_ready:  # only once a measurement is written: no empty columns otherwise
            _prepare_columns(table)
            columns_ready = True
        for row in rows:
            _write_measurement(table, row, result, request.timestamp, shared)
            touched.add(row)
    summary.rows_updated = len(touched) - summary.rows_appended
    return touched


def _rows_to_quarantine(
    table: CsvTable, quarantined: list[QuarantinedRow], touched: set[int], row_key: Callable[[int], str]
) -> list[tuple[int, str]]:
    """(row, reason) of the quarantined cases whose row is still the one collected and unmeasured."""
    doomed: list[tuple[int, str]] = []
    by_line = {table.line_of(i): i for i in range(len(table))}
    for item in quarantined:
        i = by_line.get(item.ref.row_line)
        if i is None or i in touched:
            continue
        if item.ref.signature_key and item.ref.signature_key != row_key(i):
            continue  # the file changed since collection: leave the row where it is
        doomed.append((i, item.reason))
    return doomed


def _gap_row(table: CsvTable, csv_file: str, row: int, signature_key: str) -> GapRow:
    return GapRow(
        csv_file,
        table.line_of(row),
        signature_key,
        parse_duration(table.get(row, MICROBENCH_AVERAGE)),
        parse_duration(table.get(row, PROFILING_AVERAGE)),
        *_comparable_kernels(table, row),
    )
