"""Session-end work on the controlling process: write-back, reports, the coverage gate.

Plain functions over ``RunState`` so they can be tested without running pytest.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perf_plugin.backends.select import backend_class
from perf_plugin.database.errors import DatabaseError
from perf_plugin.replay.cache_modes import cache_mode_label
from perf_plugin.results import (
    OUTCOME_FAILED,
    OUTCOME_NO_REPLAY,
    OUTCOME_QUARANTINED,
    OUTCOME_SKIPPED,
    OUTCOME_UNSUPPORTED,
    CaseResult,
    QuarantinedRow,
    RunSummary,
)
from perf_plugin.run.cases import (
    STATUS_NO_REPLAY,
    STATUS_QUARANTINED,
    STATUS_UNSUPPORTED,
)
from perf_plugin.run.coverage import (
    WEIGHT_TIME,
    coverage_by_kernel,
    format_coverage,
    gate_line,
    total_coverage,
)
from perf_plugin.run.merge import export_run
from perf_plugin.run.recovery import settle_journal
from perf_plugin.run.state import CaseRecord, RunState
from perf_plugin.run.writeback import WritebackRequest, write_back


@dataclass
class FinishOutcome:
    lines: list[str] = field(default_factory=list)
    summary: RunSummary | None = None  # None when nothing ran (collect-only, no records)
    coverage_failed: bool = False
    writeback_failed: bool = False
    interrupted: "InterruptTally | None" = None  # set for an interrupted run


def _timestamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d_%H%M%S")


_STATUS_OUTCOME = {
    STATUS_QUARANTINED: OUTCOME_QUARANTINED,
    STATUS_UNSUPPORTED: OUTCOME_UNSUPPORTED,
    STATUS_NO_REPLAY: OUTCOME_NO_REPLAY,
}


def merged_results(state: RunState) -> list[CaseResult]:
    """One result per selected case.

    Measured and failed cases have results from the processes that ran them; cases that never
    reached a measurement (skipped, no replay, quarantined, errors in set-up) get one here from
    their record, so reports count every selected row.
    """
    results = dict(state.control.results)
    for record in state.control.records.values():
        if record.ref.case_id in results:
            continue
        if record.status in _STATUS_OUTCOME:
            outcome = _STATUS_OUTCOME[record.status]
        elif record.outcome == "failed":
            outcome = OUTCOME_FAILED
        else:
            outcome = OUTCOME_SKIPPED
        results[record.ref.case_id] = CaseResult(
            record.ref, outcome, reason=record.reason or record.message, backend=state.backend_name
        )
    return [results[k] for k in sorted(results)]


def device_ids(state: RunState) -> list[int]:
    """Devices the run used: the visible accelerator ids, one per worker (none on the CPU)."""
    variable = backend_class(state.backend_name).visible_devices_var
    if variable is None:
        return []
    visible = [int(d) for d in os.environ.get(variable, "").split(",") if d.strip().isdigit()]
    count = max(state.control.workers, 1)
    return (visible or list(range(count)))[:count]


def quarantined_rows(state: RunState) -> list[QuarantinedRow]:
    return [QuarantinedRow(r.ref, r.reason) for r in state.control.records.values() if r.status == STATUS_QUARANTINED]


def build_summary(state: RunState, command: list[str]) -> RunSummary:
    settings = state.settings
    return RunSummary(
        started_at=datetime.fromtimestamp(state.started, timezone.utc).isoformat(timespec="seconds"),
        elapsed_s=round(time.perf_counter() - state.started_perf, 3),
        backend=state.backend_name,
        device_name=state.device_name,
        database_dir=str(state.location.directory),
        update_mode=settings.update_mode,
        repeat_count=settings.repeat_count,
        warmup_count=settings.warmup_count,
        cache_mode=cache_mode_label(settings.cache_mode, state.backend_name),
        repeat_markers=settings.repeat_markers,
        command=command,
        results=merged_results(state),
        quarantined=quarantined_rows(state),
        max_concurrency=max(state.control.workers, 1),
        device_ids=device_ids(state),
        coverage_min=settings.replay_coverage_min,
    )


def finish_run(
    state: RunState,
    *,
    collect_only: bool,
    command: list[str] | None = None,
    interrupted: bool = False,
) -> FinishOutcome:
    """Write back, report, gate; for an interrupted run, say what it got done."""
    outcome = FinishOutcome()
    records = list(state.control.records.values())
    table = coverage_by_kernel(records)
    total = total_coverage(table)
    fraction = total.row_fraction(collect_only)
    time_fraction = total.fraction(collect_only, WEIGHT_TIME)  # None (null in the report): nothing profiled
    minimum = state.settings.replay_coverage_min
    if minimum is not None:
        line, failed = gate_line(table, collect_only, minimum, state.settings.replay_coverage_weight)
        outcome.lines.append(line)
        if failed:
            outcome.coverage_failed = True
            outcome.lines.extend(format_coverage(table, collect_only))
    # results without records: an interrupt stopped the workers' reports, their journals kept the results
    if collect_only or not (records or state.control.results):
        outcome.lines.extend(settle_journal(state.control, written=False))
        return outcome

    summary = build_summary(state, command or sys.argv)
    outcome.summary = summary
    summary.coverage, summary.coverage_time = fraction, time_fraction
    timestamp = _timestamp()
    outcome.lines.extend(export_run(state, summary.results, timestamp))  # --perf-results-out
    rows_written = 0 if state.settings.no_writeback else _write_back(state, summary, records, timestamp, outcome)
    if interrupted:
        outcome.interrupted = interrupt_tally(state, rows_written)
        summary.interrupted = outcome.interrupted.line(state.settings.no_writeback)
        outcome.lines.append(summary.interrupted)
    summary.env = _env_spec(state.backend_name)
    try:
        paths = _write_reports(state.location.reports_dir, summary, timestamp)
        outcome.lines.extend(f"report: {p}" for p in paths)
    except Exception as exc:  # noqa: BLE001 - a report problem must not hide the write-back's outcome
        outcome.lines.append(f"reports could not be written: {type(exc).__name__}: {exc}")
    return outcome


def _write_back(
    state: RunState, summary: RunSummary, records: list[CaseRecord], timestamp: str, outcome: FinishOutcome
) -> int:
    """The run's results into the CSVs (the journal settled after); the rows written."""
    request = WritebackRequest(
        directory=state.location.directory,
        update_mode=state.settings.update_mode,
        prune_empty_duration_rows=state.settings.prune_empty_duration_rows,
        timestamp=timestamp,
        lock_timeout=state.settings.lock_timeout,
    )
    try:
        files, gaps = write_back(request, summary.results, summary.quarantined, scope={r.ref.csv_file for r in records})
    except (DatabaseError, OSError) as exc:
        outcome.writeback_failed = True
        outcome.lines.append(f"write-back failed, database left as it was: {exc}")
        files, gaps = [], []
    summary.files, summary.gaps = files, gaps
    outcome.lines.extend(settle_journal(state.control, written=not outcome.writeback_failed))
    written = [f for f in files if f.written]
    outcome.lines.append(
        f"write-back ({state.settings.update_mode}): {len(written)} file(s) written, "
        f"{sum(f.rows_updated for f in files)} rows updated, {sum(f.rows_appended for f in files)} appended, "
        f"{sum(f.rows_quarantined for f in files)} quarantined, {sum(f.rows_pruned for f in files)} pruned"
    )
    return sum(f.rows_updated + f.rows_appended for f in files)


@dataclass(frozen=True)
class InterruptTally:
    """What an interrupted run got done: the closing line's counts."""

    measured: int  # cases with a measured duration, from whichever process measured them
    written: int  # rows write-back updated or appended
    left: int  # selected cases without a measurement: what --perf-update-mode missing-only runs

    def line(self, no_writeback: bool) -> str:
        written = "not written (--perf-no-writeback)" if no_writeback else f"{self.written} row(s) written"
        return (
            f"interrupted: {self.measured} case(s) measured, {written}, {self.left} case(s) left; "
            "--perf-update-mode missing-only measures the rest"
        )


def interrupt_tally(state: RunState, rows_written: int) -> InterruptTally:
    control = state.control
    measured = sum(1 for r in control.results.values() if r.has_duration)
    return InterruptTally(measured, rows_written, max(control.selected_cases - measured, 0))


def _env_spec(backend: str) -> dict[str, Any]:
    try:
        from perf_plugin.report.environment import collect_env_spec
    except ImportError:
        return {}
    return collect_env_spec(backend)


def _write_reports(reports_dir: Path, summary: RunSummary, timestamp: str) -> list[Path]:
    from perf_plugin.report.writer import write_reports

    return write_reports(reports_dir, summary, timestamp)
