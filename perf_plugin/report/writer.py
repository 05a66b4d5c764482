"""Writes a run's reports into ``reports/`` and formats the coverage table for the terminal.

One timestamp (UTC, ``%Y%m%d_%H%M%S``) names every file of a run, the same one write-back
stamps into the CSVs, so a report and the rows it describes can be matched::

    replay_report_<ts>.md   duration_gap_<ts>.csv   run_report_<ts>.json   [duration_gap_<ts>.png]

The plot is written only when matplotlib is installed and some row has both durations.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

from perf_plugin.database.atomic import atomic_write_text
from perf_plugin.report.gap import write_gap_csv
from perf_plugin.report.markdown import render_replay_report
from perf_plugin.report.plot import plot_gap
from perf_plugin.report.run_json import write_run_report
from perf_plugin.report.tally import tally_cases
from perf_plugin.results import CaseResult, QuarantinedRow, RunSummary

TIMESTAMP_FORMAT = "%Y%m%d_%H%M%S"
_TIMESTAMP = re.compile(r"\d{8}_\d{6}")

CoverageRow = tuple[str, int, int, int, float]  # kernel type, selected, with replay, passed, fraction


def report_timestamp(moment: datetime | None = None) -> str:
    """The run's timestamp in UTC (now by default; an aware ``moment`` is converted)."""
    return (moment or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime(TIMESTAMP_FORMAT)


def report_paths(reports_dir: Path, timestamp: str) -> dict[str, Path]:
    if not _TIMESTAMP.fullmatch(timestamp):
        # The timestamp becomes part of file names: refuse anything else (a path, a typo).
        raise ValueError(f"report timestamp {timestamp!r} is not in the form {TIMESTAMP_FORMAT}")
    return {
        "markdown": reports_dir / f"replay_report_{timestamp}.md",
        "gap": reports_dir / f"duration_gap_{timestamp}.csv",
        "json": reports_dir / f"run_report_{timestamp}.json",
        "plot": reports_dir / f"duration_gap_{timestamp}.png",
    }


def write_reports(reports_dir: Path, summary: RunSummary, timestamp: str) -> list[Path]:
    """Write the markdown, gap CSV and JSON reports (and the plot, if possible); return their paths."""
    reports_dir = Path(reports_dir)
    paths = report_paths(reports_dir, timestamp)
    reports_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(paths["markdown"], render_replay_report(summary))
    write_gap_csv(paths["gap"], summary.gaps)
    write_run_report(paths["json"], summary)  # streamed, a line per case
    written = [paths["markdown"], paths["gap"], paths["json"]]
    try:
        plot = plot_gap(paths["plot"], summary.gaps)
    except Exception as exc:  # noqa: BLE001 - an optional picture must not cost the reports above
        warnings.warn(f"duration gap plot not written: {type(exc).__name__}: {exc}", stacklevel=2)
        plot = None
    if plot is not None:
        written.append(plot)
    return written


def coverage_table(
    source: RunSummary | Iterable[CaseResult], quarantined: Iterable[QuarantinedRow] = ()
) -> list[CoverageRow]:
    """Per kernel type: rows selected, rows with a replay, rows that passed, passed / selected.

    A row *has a replay* unless it was quarantined or its kernel type has none; it is *covered*
    when its case passed, which is what ``--perf-replay-coverage-min`` asks of the run.
    """
    if isinstance(source, RunSummary):
        tally = tally_cases(source.results, source.quarantined)
    else:
        tally = tally_cases(source, quarantined)
    return [
        (k.kernel_type, k.rows, k.with_replay, k.passed, k.passed / k.rows if k.rows else 1.0)
        for k in tally.kernels.values()
    ]


def format_coverage_table(rows: Iterable[CoverageRow]) -> list[str]:
    """Plain-text lines: one per kernel type and a total, columns aligned."""
    rows = list(rows)
    selected = sum(r[1] for r in rows)
    with_replay = sum(r[2] for r in rows)
    passed = sum(r[3] for r in rows)
    total: CoverageRow = ("total", selected, with_replay, passed, passed / selected if selected else 1.0)
    width = max(len(r[0]) for r in [*rows, total, ("kernel type", 0, 0, 0, 0.0)])
    lines = [f"{'kernel type':<{width}}  {'rows':>6}  {'replay':>6}  {'passed':>6}  {'covered':>8}"]
    for name, n_selected, n_replay, n_passed, fraction in [*rows, total]:
        lines.append(f"{name:<{width}}  {n_selected:>6}  {n_replay:>6}  {n_passed:>6}  {100 * fraction:>7.1f}%")
    return lines
