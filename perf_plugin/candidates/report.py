"""The controller's end of a candidate run: scores, baseline, trace files and the run JSON.

Inputs are plain data gathered from every process: the judge's verdicts, the candidate's
measurements, the reference replay's results and the rows' weights.  The reference time of a
row is taken from the baseline file when it holds the row for this device (KernelBench's second
step: candidates judged against one stored baseline), else from this run's reference replay,
which is then added to the baseline file (its first step).

The run JSON follows the reproduction-run convention (seed ``000``): ``stats.op_results[op]``
holds ``passed`` (rows whose candidate is correct), ``total`` (rows judged) and, where a
correct row was timed, ``profile: {gen_time, base_time, speedup}`` -- the candidate's and the
reference's summed mean device times over those rows, in microseconds, and their ratio.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perf_plugin.candidates.artifacts import write_row_artifacts
from perf_plugin.candidates.baseline import (
    BaselineEntry,
    entry_from_samples,
    lookup,
    read_baseline,
    write_baseline,
)
from perf_plugin.candidates.judge import Verdict, reference_case_id
from perf_plugin.candidates.scoring import (
    OVERALL,
    RowScore,
    fast_p_table,
    table_lines,
    threshold_key,
)
from perf_plugin.database.atomic import atomic_write_text
from perf_plugin.results import CaseRef, CaseResult

WORKFLOW = "candidate"
SCRIPT = "pytest bench --perf-candidate"


@dataclass
class CandidateRun:
    """Everything the controller gathered about one candidate run."""

    candidate_file: Path
    source: str
    verdicts: list[Verdict]
    candidate_results: dict[str, CaseResult]  # by the reference case id
    reference_results: Mapping[str, CaseResult]  # by case id
    refs: Mapping[str, CaseRef]  # by case id: the judged rows' refs (signature for the baseline)
    weights: Mapping[str, float]  # by case id: profiled time of the row
    device_key: str  # baseline key: the database's device directory
    hardware: str  # the device's own name
    backend: str
    thresholds: Sequence[float]
    log_dir: Path
    baseline_path: Path
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def _mean(result: CaseResult | None) -> float | None:
    if result is None or result.outcome != "passed" or not result.samples_us:
        return None
    return statistics.fmean(result.samples_us)


def score_rows(run: CandidateRun, baseline: dict[str, dict[str, dict[str, BaselineEntry]]]) -> tuple[list[RowScore], int]:
    """One score per verdict; also how many reference times the baseline file lacked and this
    run measured (added to ``baseline``)."""
    scores = []
    added = 0
    for verdict in run.verdicts:
        ref = run.refs.get(verdict.case_id) or CaseRef(verdict.case_id, verdict.kernel_type, verdict.csv_file, verdict.row_line, "")
        stored = lookup(baseline, run.device_key, ref)
        source = "baseline"
        base = stored.mean_us if stored is not None else None
        if base is None:
            source = "run"
            reference = run.reference_results.get(verdict.case_id)
            base = _mean(reference)
            if base is not None and reference is not None:
                entry = entry_from_samples(ref, reference.samples_us, run.hardware, run.backend)
                baseline.setdefault(run.device_key, {}).setdefault(ref.kernel_type, {})[ref.case_id] = entry
                added += 1
        gen = _mean(run.candidate_results.get(verdict.case_id)) if verdict.timed else None
        correct = verdict.correct
        scores.append(RowScore(verdict.case_id, verdict.kernel_type, correct, base, gen, run.weights.get(verdict.case_id, 0.0), source))
    return scores, added


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def row_profile(score: RowScore, verdict: Verdict, candidate: CaseResult | None) -> dict[str, Any]:
    """The profile JSON of one row (also its entry in the run JSON's ``results``)."""
    return {
        "case_id": score.case_id,
        "kernel_type": score.kernel_type,
        "csv_file": verdict.csv_file,
        "row_line": verdict.row_line,
        "correct": score.correct,
        "checks": verdict.checks,
        "checks_passed": verdict.checks_passed,
        "reason": verdict.reason,
        "gen_time": _finite(score.gen_us),
        "base_time": _finite(score.base_us),
        "base_source": score.base_source,
        "speedup": _finite(score.speedup),
        "weight_us": score.weight_us,
        "unit": "us",
        "gen_samples_us": list(candidate.samples_us) if candidate is not None else [],
        "gen_kernels": [{"name": k.name, "mean_us": k.mean_us, "calls_per_repeat": k.calls_per_repeat} for k in candidate.kernels]
        if candidate is not None
        else [],
    }


def op_results(scores: Sequence[RowScore]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for kernel_type in sorted({s.kernel_type for s in scores}):
        rows = [s for s in scores if s.kernel_type == kernel_type]
        entry: dict[str, Any] = {"passed": sum(1 for s in rows if s.correct), "total": len(rows)}
        timed = [s for s in rows if s.correct and s.speedup is not None]
        if timed:
            gen = sum(s.gen_us or 0.0 for s in timed)
            base = sum(s.base_us or 0.0 for s in timed)
            entry["profile"] = {"gen_time": gen, "base_time": base, "speedup": base / gen if gen > 0 else None}
        results[kernel_type] = entry
    return results


def build_run_json(run: CandidateRun, scores: Sequence[RowScore], table: dict[str, dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    total = len(scores)
    passed = sum(1 for s in scores if s.correct)
    return {
        "benchmark": f"perf_plugin.candidates:{run.candidate_file.name}",
        "script": SCRIPT,
        "workflow": WORKFLOW,
        "pass_n": 1,
        "ops_count": total,
        "elapsed_s": run.elapsed_s,
        "device_ids": [],
        "max_concurrency": 1,
        "llm_concurrency": 0,
        "env_spec": {"backend": run.backend, "hardware": run.hardware, "device": run.device_key},
        "task_log_dir": str(run.log_dir),
        "stats": {
            "total_ops": total,
            "passed_ops": passed,
            "failed_ops": total - passed,
            "pass_rate": round(passed / total, 3) if total else 0.0,
            "op_results": op_results(scores),
        },
        "fast_p": {group: entry["fast_p"] for group, entry in table.items()},
        "thresholds": [threshold_key(p) for p in run.thresholds],
        "baseline_file": str(run.baseline_path),
        "results": rows,
    }


def finish_candidate_run(run: CandidateRun) -> tuple[dict[str, dict[str, Any]], list[str], Path]:
    """Score, write the trace files, the baseline file and the run JSON; returns the fast_p
    table, the terminal lines and the run JSON's path.  Raises BaselineError for a bad baseline."""
    baseline = read_baseline(run.baseline_path)
    scores, added = score_rows(run, baseline)
    verdicts = {v.case_id: v for v in run.verdicts}
    rows = []
    for score in scores:
        verdict = verdicts[score.case_id]
        profile = row_profile(score, verdict, run.candidate_results.get(score.case_id))
        rows.append(profile)
        task = verdict.row_line if verdict.row_line is not None else score.case_id
        write_row_artifacts(run.log_dir, score.kernel_type, task, run.source, verdict.log, profile)
    if added:
        write_baseline(run.baseline_path, baseline)
    table = fast_p_table(scores, run.thresholds)
    stamp = time.strftime("%Y%m%d_%H%M%S")
    path = run.log_dir / f"candidate_run_{stamp}.json"
    run.log_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(build_run_json(run, scores, table, rows), indent=2) + "\n")
    from_baseline = sum(1 for s in scores if s.base_source == "baseline")
    lines = [f"candidate {run.candidate_file}: {len(scores)} rows judged, {table[OVERALL]['correct']} correct"]
    lines += table_lines(table, run.thresholds)
    lines.append(
        f"reference times: {from_baseline} from {run.baseline_path}, {len(scores) - from_baseline} from this run"
        + (f" ({added} added to the baseline file)" if added else "")
    )
    lines.append(f"candidate report: {path}; trace files under {run.log_dir}")
    failed = [s for s in scores if not s.correct]
    for score in failed[:10]:
        lines.append(f"  wrong: {score.case_id}: {verdicts[score.case_id].reason}")
    if len(failed) > 10:
        lines.append(f"  ... and {len(failed) - 10} more wrong rows (see the report)")
    return table, lines, path


def gather_candidate_results(results: Iterable[CaseResult]) -> dict[str, CaseResult]:
    return {reference_case_id(r.ref): r for r in results}
