"""The JSON run report (``reports/run_report_<timestamp>.json``), in the reproduction-run convention.

The convention fixes these top-level fields; here is what each means for a replay run:

``benchmark``        ``"perf_plugin.replay:<database directory name>"`` (the version directory,
                     e.g. ``perf_plugin.replay:vllm0.18.0_torch2.9.0_cann8.5``).
``script``           ``"pytest bench"``.
``workflow``         ``"replay"``.
``pass_n``           always 1: each database row is one case and runs once (its repeats are
                     timing samples of one run, not independent attempts).
``ops_count``        number of cases: every selected row, whatever became of it.
``elapsed_s``        wall time of the pytest session, in seconds.
``device_ids``       device indices the run used, as the controller recorded them (may be empty
                     where it recorded none, e.g. a CPU run).
``max_concurrency``  processes that ran cases at once (pytest-xdist workers, 1 without xdist).
``llm_concurrency``  always 0: no language model takes part in a replay run; the field has no
                     meaning here and is kept only because the convention requires it.
``env_spec``         ``collect_env_spec`` of the controlling process.
``task_log_dir``     the reports directory the report was written to.
``stats``            ``total_ops`` = ``ops_count``; ``passed_ops`` = cases that replayed, verified
                     and were timed; ``failed_ops`` = every other case (failed, skipped, no replay,
                     quarantined; the breakdown is under ``outcome_counts``); ``pass_rate`` =
                     passed / total rounded to 3 decimals (0.0 for no cases).  ``op_results`` is
                     keyed by kernel type (an "op" is a kernel type, i.e. one database CSV):
                     ``passed`` / ``total`` count its cases, and ``profile`` --
                     ``{median_average_us, cases_with_duration}``, the median over its measured
                     cases of ``Average Duration(us)`` -- appears only when one was measured.

Fields this report adds (optional in the convention, each under its own key): ``replay_run``
(run settings), ``outcome_counts``, ``results`` (one entry per case), ``quarantined``,
``writeback`` (one entry per CSV file), ``duration_gap`` (counts of the gap CSV) and
``columns``: what each measurement column write-back fills holds (``Average Duration(us)`` is
the mean of the timed repeats; docs/ascend-reader-contract.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from perf_plugin.database.atomic import atomic_write_text_chunks
from perf_plugin.database.schema import written_column_meanings
from perf_plugin.report.gap import GAP_BAND, is_flagged
from perf_plugin.report.tally import RunTally, quarantined_kernel_type, tally_summary
from perf_plugin.results import CaseResult, FileWriteback, RunSummary, SampleStats

BENCHMARK_PREFIX = "perf_plugin.replay"
SCRIPT = "pytest bench"
WORKFLOW = "replay"
PASS_N = 1
LLM_CONCURRENCY = 0


def _number(value: float) -> float | None:
    """JSON has no NaN or infinity: such floats become null."""
    return value if math.isfinite(value) else None


def finite_values(value: Any) -> Any:
    """Every float of a nested structure kept if finite, else None (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_values(v) for v in value]
    return value


def _stats(tally: RunTally) -> dict[str, Any]:
    total = tally.rows
    passed = tally.total("passed")
    op_results: dict[str, Any] = {}
    for kernel in tally.kernels.values():
        entry: dict[str, Any] = {"passed": kernel.passed, "total": kernel.rows}
        if kernel.averages_us:
            entry["profile"] = {
                "median_average_us": kernel.median_average_us,
                "cases_with_duration": len(kernel.averages_us),
            }
        op_results[kernel.kernel_type] = entry
    return {
        "total_ops": total,
        "passed_ops": passed,
        "failed_ops": total - passed,
        "pass_rate": round(passed / total, 3) if total else 0.0,
        "op_results": op_results,
    }


def _case(result: CaseResult) -> dict[str, Any]:
    # Built finite field by field: walking every case again with ``finite_values`` would double the cost.
    stats = None
    if result.samples_us:
        s = SampleStats.of(result.samples_us)
        stats = {"mean_us": _number(s.mean), "median_us": _number(s.median), "min_us": _number(s.minimum),
                 "std_us": _number(s.std), "count": s.count}
    return {
        "case_id": result.ref.case_id,
        "kernel_type": result.ref.kernel_type,
        "reported_kernel_type": result.reported_kernel_type,
        "csv_file": result.ref.csv_file,
        "row_line": result.ref.row_line,
        "outcome": result.outcome,
        "reason": result.reason,
        "backend": result.backend,
        "stats": stats,
        "kernels": [
            {"name": k.name, "mean_us": _number(k.mean_us), "calls_per_repeat": _number(k.calls_per_repeat)}
            for k in result.kernels
        ],
        "counters": {name: _number(value) for name, value in result.counters.items()},
    }


def reports_dir_of(summary: RunSummary) -> Path:
    return Path(summary.database_dir) / "reports"


def build_run_report(summary: RunSummary, reports_dir: str | Path | None = None, *, cases: bool = True) -> dict[str, Any]:
    """The run report as one object; ``cases=False`` leaves the per-case entries out (``results``
    is then None), for ``iter_run_report``, which writes them one at a time."""
    tally = tally_summary(summary)
    report: dict[str, Any] = {
        "benchmark": f"{BENCHMARK_PREFIX}:{Path(summary.database_dir).name}",
        "script": SCRIPT,
        "workflow": WORKFLOW,
        "pass_n": PASS_N,
        "ops_count": tally.rows,
        "elapsed_s": float(summary.elapsed_s),
        "device_ids": [int(d) for d in summary.device_ids],
        "max_concurrency": int(summary.max_concurrency),
        "llm_concurrency": LLM_CONCURRENCY,
        "env_spec": dict(summary.env),
        "task_log_dir": str(reports_dir if reports_dir is not None else reports_dir_of(summary)),
        "stats": _stats(tally),
        "replay_run": _replay_run(summary),
        "outcome_counts": {
            "passed": tally.total("passed"),
            "failed": tally.total("failed"),
            "skipped": tally.total("skipped"),
            "no_replay": tally.total("no_replay"),
            "unsupported": tally.total("unsupported"),
            "quarantined": tally.total("quarantined"),
        },
        "results": [_case(r) for r in summary.results] if cases else None,
        "quarantined": [
            {"csv_file": q.ref.csv_file, "row_line": q.ref.row_line, "kernel_type": quarantined_kernel_type(q),
             "reason": q.reason}
            for q in summary.quarantined
        ],
        "writeback": [_writeback(f) for f in summary.files],
        "duration_gap": _duration_gap(summary),
        "columns": written_column_meanings(),
    }
    # The per-case entries are finite already; everything else is small.
    return {key: value if key == "results" else finite_values(value) for key, value in report.items()}


def _replay_run(summary: RunSummary) -> dict[str, Any]:
    return {
        "started_at": summary.started_at,
        "backend": summary.backend,
        "device": summary.device_name,
        "database_dir": summary.database_dir,
        "update_mode": summary.update_mode,
        "repeat_count": summary.repeat_count,
        "warmup_count": summary.warmup_count,
        "cache_mode": summary.cache_mode,
        "repeat_markers": summary.repeat_markers,
        "command": list(summary.command),
        "coverage": summary.coverage,
        "coverage_time": summary.coverage_time,
        "coverage_min": summary.coverage_min,
        "interrupted": summary.interrupted,
    }


def _duration_gap(summary: RunSummary) -> dict[str, Any]:
    compared = [g for g in summary.gaps if g.ratio is not None]
    return {
        "band": list(GAP_BAND),
        "rows": len(summary.gaps),
        "compared": len(compared),
        "flagged": sum(1 for g in compared if is_flagged(g)),
        "kernels_compared": sum(1 for g in summary.gaps if g.profiled_kernels and g.replayed_kernels),
        "kernels_differ": [
            {"csv_file": g.csv_file, "row_line": g.row_line, "difference": difference.describe()}
            for g in summary.gaps
            if (difference := g.kernel_difference) is not None
        ],
    }


def _writeback(f: FileWriteback) -> dict[str, Any]:
    return {
        "csv_file": f.csv_file,
        "rows_updated": f.rows_updated,
        "rows_appended": f.rows_appended,
        "rows_pruned": f.rows_pruned,
        "rows_quarantined": f.rows_quarantined,
        "unmatched_samples": list(f.unmatched_samples),
        "written": f.written,
    }


# Lists written one item per line: readable, diffable, and encoded by json's C encoder, which
# ``indent`` would bypass (an indented 20,000-case report takes seconds, this a fraction).
ONE_ITEM_PER_LINE: frozenset[str] = frozenset({"results", "quarantined", "writeback"})


def report_json(value: Any, indent: int | None = None) -> str:
    # default=str: env_spec comes from outside this module and may hold a non-JSON value.
    return json.dumps(value, indent=indent, ensure_ascii=False, allow_nan=False, default=str)


def iter_run_report(summary: RunSummary, reports_dir: str | Path | None = None) -> Iterator[str]:
    """The run report's JSON text in pieces, a line per case: a run of 100,000 cases never holds
    every case's entry, or the whole text, at once (together ~170 MiB at that size)."""
    report = build_run_report(summary, reports_dir, cases=False)
    yield "{\n"
    for number, (key, value) in enumerate(report.items()):
        separator = ",\n" if number else ""
        yield f"{separator}  {report_json(key)}: "
        if key == "results":
            yield from _one_per_line(_case(r) for r in summary.results)
        elif key in ONE_ITEM_PER_LINE and isinstance(value, list) and value:
            yield from _one_per_line(value)
        else:
            # JSON strings never hold a raw newline, so re-indenting by lines is safe.
            yield report_json(value, indent=2).replace("\n", "\n  ")
    yield "\n}\n"


def _one_per_line(items: Iterable[Any]) -> Iterator[str]:
    opened = False
    for item in items:
        yield f"{',' if opened else '['}\n    {report_json(item)}"
        opened = True
    yield "\n  ]" if opened else "[]"


def render_run_report(summary: RunSummary, reports_dir: str | Path | None = None) -> str:
    return "".join(iter_run_report(summary, reports_dir))


def write_run_report(path: str | Path, summary: RunSummary) -> Path:
    target = Path(path)
    atomic_write_text_chunks(target, iter_run_report(summary, target.parent))
    return target
