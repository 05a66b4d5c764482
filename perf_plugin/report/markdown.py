"""The human-readable replay report: ``reports/replay_report_<timestamp>.md``.

Sections, in the order someone checking a run reads them: run facts, case counts, a table per
kernel type, what write-back did to each file, quarantined rows, failed cases, the rows whose
microbench duration is furthest from the profiled one, and the kernels behind cases that
launched more than one.  Sections with nothing to show say so in one line rather than vanish,
so two reports always compare section by section.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence

from perf_plugin.database.schema import format_number
from perf_plugin.report.gap import GAP_BAND, RATIO_DIGITS, is_flagged, kernel_mismatches, top_outliers
from perf_plugin.report.tally import RunTally, quarantined_kernel_type, tally_summary
from perf_plugin.results import OUTCOME_FAILED, CaseResult, RunSummary

TOP_GAPS = 20


def cell(value: object) -> str:
    """A table cell: one line, with the characters markdown tables give meaning to escaped."""
    text = "" if value is None else str(value)
    text = " ".join(text.split())  # newlines would end the row
    return text.replace("\\", "\\\\").replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """A pipe table; ``align`` holds one character per column, ``r`` right-aligns it."""
    marks = [("---:" if (align[i:i + 1] == "r") else "---") for i in range(len(header))]
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "| " + " | ".join(marks) + " |"]
    lines.extend("| " + " | ".join(cell(v) for v in row) + " |" for row in rows)
    return lines


def us(value: float | None) -> str:
    return "" if value is None else format_number(value, 3)


def _line(value: int | None) -> str:
    return "" if value is None else str(value)


def _facts(summary: RunSummary) -> list[str]:
    devices = ", ".join(str(d) for d in summary.device_ids) if summary.device_ids else "-"
    coverage = "-"
    if summary.coverage is not None:
        coverage = f"{100 * summary.coverage:.1f}%"
        if summary.coverage_time is not None:
            coverage += f" of rows, {100 * summary.coverage_time:.1f}% of profiled time"
        if summary.coverage_min is not None:
            coverage += f" (minimum {100 * summary.coverage_min:.1f}%)"
    command = shlex.join(summary.command) if summary.command else "-"
    rows = [
        ("started (UTC)", summary.started_at),
        ("backend", summary.backend),
        ("device", summary.device_name),
        ("database", f"`{summary.database_dir}`"),
        ("update mode", summary.update_mode),
        ("repeats / warm-up", f"{summary.repeat_count} / {summary.warmup_count}"),
        ("cache mode", summary.cache_mode),
        ("elapsed", f"{summary.elapsed_s:.1f} s"),
        ("workers / device ids", f"{summary.max_concurrency} / {devices}"),
        ("replay coverage", coverage),
        ("command", f"`{command}`"),
    ]
    if summary.interrupted:
        rows.insert(0, ("**interrupted**", summary.interrupted))
    return table(("run", "value"), rows)


def _counts(tally: RunTally) -> list[str]:
    header = ("cases", "passed", "failed", "skipped", "no replay", "cannot build", "quarantined")
    row = (tally.rows, tally.total("passed"), tally.total("failed"), tally.total("skipped"),
           tally.total("no_replay"), tally.total("unsupported"), tally.total("quarantined"))
    return table(header, [row], "rrrrrrr")


def _kernels(tally: RunTally) -> list[str]:
    header = ("kernel type", "rows", "replayed", "passed", "failed", "skipped", "no replay", "cannot build", "quarantined",
              "median Average Duration(us)")
    rows = [
        (k.kernel_type, k.rows, k.replayed, k.passed, k.failed, k.skipped, k.no_replay, k.unsupported, k.quarantined,
         us(k.median_average_us))
        for k in tally.kernels.values()
    ]
    return table(header, rows, "lrrrrrrrrr") if rows else ["No cases."]


def _writeback(summary: RunSummary) -> list[str]:
    if not summary.files:
        return ["Write-back did not run or changed no file."]
    header = ("file", "updated", "appended", "pruned", "quarantined", "unmatched", "written")
    rows = [
        (f.csv_file, f.rows_updated, f.rows_appended, f.rows_pruned, f.rows_quarantined,
         len(f.unmatched_samples), "yes" if f.written else "no")
        for f in summary.files
    ]
    lines = table(header, rows, "lrrrrrl")
    unmatched = [(f.csv_file, case) for f in summary.files for case in f.unmatched_samples]
    if unmatched:
        lines += ["", "Measurements that matched no row:", ""]
        lines += table(("file", "case"), unmatched)
    return lines


def _quarantined(summary: RunSummary) -> list[str]:
    if not summary.quarantined:
        return ["No row was quarantined."]
    rows = [(q.ref.csv_file, _line(q.ref.row_line), quarantined_kernel_type(q), q.reason) for q in summary.quarantined]
    return table(("file", "line", "kernel type", "reason"), rows, "lr")


def _failed(results: Sequence[CaseResult]) -> list[str]:
    failed = [r for r in results if r.outcome == OUTCOME_FAILED]
    if not failed:
        return ["No case failed."]
    rows = [(r.ref.case_id, r.ref.csv_file, _line(r.ref.row_line), r.reason) for r in failed]
    return table(("case", "file", "line", "reason"), rows, "llr")


def _gaps(summary: RunSummary) -> list[str]:
    low, high = GAP_BAND
    compared = [g for g in summary.gaps if g.ratio is not None]
    outliers = top_outliers(compared, TOP_GAPS)
    flagged = sum(1 for g in compared if is_flagged(g))
    intro = (
        f"{flagged} of {len(compared)} rows with both durations have a ratio "
        f"(microbench / profiling) outside [{low:g}, {high:g}]."
    )
    if not outliers:
        return [intro]
    if flagged > len(outliers):
        intro += f" The {len(outliers)} furthest from agreement:"
    header = ("file", "line", "signature", "microbench (us)", "profiling (us)", "ratio")
    rows = [
        (g.csv_file, _line(g.row_line), g.signature_key, us(g.microbench_us), us(g.profiling_us),
         format_number(g.ratio or 0.0, RATIO_DIGITS))
        for g in outliers
    ]
    return [intro, "", *table(header, rows, "lrlrrr")]


def _other_kernels(summary: RunSummary) -> list[str]:
    compared = [g for g in summary.gaps if g.profiled_kernels and g.replayed_kernels]
    if not compared:
        return ["No row has the kernels of its profile to compare with (a PyTorch trace with device activity records them)."]
    mismatched = kernel_mismatches(compared)
    intro = (
        f"{len(mismatched)} of {len(compared)} rows whose profile recorded its kernels launched other kernels "
        "in the replay: a composition standing in for a fused kernel, or the library choosing another kernel."
    )
    if not mismatched:
        return [intro]
    rows = [
        (g.csv_file, _line(g.row_line), g.signature_key, difference.describe())
        for g in mismatched[:TOP_GAPS]
        if (difference := g.kernel_difference) is not None
    ]
    if len(mismatched) > len(rows):
        intro += f" The first {len(rows)}:"
    return [intro, "", *table(("file", "line", "signature", "difference"), rows, "lrll")]


def _breakdown(results: Sequence[CaseResult]) -> list[str]:
    several = [r for r in results if len(r.kernels) > 1]
    if not several:
        return ["No case launched more than one kernel."]
    rows = []
    for result in several:
        total = sum(k.mean_us for k in result.kernels)
        for kernel in result.kernels:
            share = f"{100 * kernel.mean_us / total:.1f}%" if total > 0 else ""
            rows.append((result.ref.case_id, kernel.name, us(kernel.mean_us), format_number(kernel.calls_per_repeat, 2),
                         share))
    return table(("case", "kernel", "mean per repeat (us)", "calls per repeat", "share"), rows, "llrrr")


def render_replay_report(summary: RunSummary) -> str:
    tally = tally_summary(summary)
    sections: list[tuple[str, list[str]]] = [
        ("Cases", _counts(tally)),
        ("Kernel types", _kernels(tally)),
        ("Write-back", _writeback(summary)),
        ("Quarantined rows", _quarantined(summary)),
        ("Failed cases", _failed(summary.results)),
        ("Duration gap outliers", _gaps(summary)),
        ("Replays that launched other kernels than the profile", _other_kernels(summary)),
        ("Cases with several kernels", _breakdown(summary.results)),
    ]
    lines = ["# Replay report", "", *_facts(summary)]
    for title, body in sections:
        lines += ["", f"## {title}", "", *body]
    return "\n".join(lines) + "\n"
