"""Run the pytest session under msprof, and collect its cases and profile on the controller.

See ``perf_plugin.profiling.msprof`` for the whole picture.  When the session ends before
recording its results (a kernel that brings its process down: an AI Core exception, a
segmentation fault), each kernel type is run again in a session of its own, the others
deselected, so that a kernel type whose session also ends early costs only its own rows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perf_plugin.database.atomic import atomic_write_text
from perf_plugin.results import OUTCOME_FAILED, CaseResult
from perf_plugin.run.ascend_env import custom_opp_message
from perf_plugin.run.state import CaseRecord

if TYPE_CHECKING:
    from perf_plugin.run.cases import Case
    from perf_plugin.run.state import RunState

from perf_plugin.profiling.msprof import (
    CHILD_ENV,
    MODE_READ,
    OUTPUT_ENV,
    RECORD_ENV,
    SESSION_REPORT,
    MeasuredCase,
    MsprofError,
    read_measured,
)
from perf_plugin.profiling.msprof_match import as_measured, match_profile

# Operator durations with shapes (task-time), and the per-task AI Core / AI Vector counters.
MSPROF_OPTIONS: tuple[str, ...] = (
    "--task-time=on",
    "--ai-core=on",
    "--aic-mode=task-based",
    "--aic-metrics=PipeUtilization",
)
# Characters msprof refuses in a path argument.
_FORBIDDEN_PATH_CHARACTERS = frozenset("\n\f\r\b\t\v\x7f\"'\\%<>|&$;`")
# pytest reads arguments from a file named as ``@file``, one a line: the deselected node ids
# would not fit a command line.
DESELECT_ARGS = "deselect.args"


def msprof_command(msprof: str, output_dir: str | Path, argv: Sequence[str], python: str) -> list[str]:
    """``msprof --output=<dir> <options> <python> -m pytest <argv>`` (the app at the end, as documented)."""
    output = str(output_dir)
    bad = sorted(set(output) & _FORBIDDEN_PATH_CHARACTERS)
    if bad:
        raise MsprofError(f"msprof output directory {output!r} contains characters msprof refuses: {''.join(bad)!r}")
    return [msprof, f"--output={output}", *MSPROF_OPTIONS, python, "-m", "pytest", *argv]


def find_prof_dirs(output_dir: str | Path) -> list[Path]:
    """The ``PROF_*`` directories under ``output_dir`` (not nested in one another), newest last."""
    root = Path(output_dir)
    found = [
        path
        for path in root.rglob("PROF_*")
        if path.is_dir() and not any(parent.name.startswith("PROF_") for parent in path.relative_to(root).parents)
    ]
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def default_output_root(rootdir: str | Path, environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get(OUTPUT_ENV) or Path(rootdir) / "msprof_output")


@dataclass
class LaunchOutcome:
    returncode: int
    output_dir: Path
    record_dir: Path
    prof_dirs: list[Path]


def run_under_msprof(
    argv: Sequence[str],
    *,
    cwd: str | Path,
    output_root: str | Path,
    environ: Mapping[str, str] | None = None,
    python: str = sys.executable,
    label: str = "",
    deselect: Sequence[str] = (),
) -> LaunchOutcome:
    """Run ``python -m pytest argv`` under msprof in a fresh output directory; return where it wrote.

    ``label`` ends the directory's name; the node ids in ``deselect`` are left out of the session
    (``--deselect`` lines of ``deselect.args`` in that directory).  The child inherits this
    process's standard streams, so its progress shows as it runs.
    """
    environ = dict(os.environ if environ is None else environ)
    msprof = shutil.which("msprof", path=environ.get("PATH"))
    if msprof is None:
        raise MsprofError(
            "msprof was not found on PATH: source the CANN toolkit's set_env.sh "
            "(e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh), or read an existing profile with --perf-prof-path"
        )
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d_%H%M%S")
    output_dir = (Path(output_root) / f"run_{stamp}_{os.getpid()}{'_' + label if label else ''}").resolve()
    record_dir = output_dir / "perf_session"
    args_file = output_dir / DESELECT_ARGS
    command = msprof_command(msprof, output_dir, [*argv, f"@{args_file}"] if deselect else argv, python)
    record_dir.mkdir(parents=True, exist_ok=True)
    if deselect:
        args_file.write_text("".join(f"--deselect={nodeid}\n" for nodeid in deselect), encoding="utf-8")
    environ[CHILD_ENV] = "1"
    environ[RECORD_ENV] = str(record_dir)
    completed = subprocess.run(command, cwd=str(cwd), env=environ, check=False)
    return LaunchOutcome(completed.returncode, output_dir, record_dir, find_prof_dirs(output_dir))


# ---------------------------------------------------------------------------- child side
def write_child_report(state: "RunState", record_dir: str | Path | None = None) -> Path | None:
    """In the session under msprof: record outcomes and failures for the parent (no write-back)."""
    record = record_dir if record_dir is not None else os.environ.get(RECORD_ENV)
    if not record:
        state.notes.append(
            f"{CHILD_ENV}=1 and no {RECORD_ENV}: nothing written; read this run's profile with --perf-prof-path"
        )
        return None
    path = Path(record) / SESSION_REPORT
    report = {
        "records": {nodeid: r.to_json() for nodeid, r in state.control.records.items()},
        # durations come from op_summary: only what did not measure travels (failures, skips)
        "results": [r.to_json() for r in state.control.results.values() if not r.has_duration],
        "workers": state.control.workers,
    }
    atomic_write_text(path, json.dumps(report))
    return path


def _read_child_report(record_dir: Path) -> dict[str, Any] | None:
    """The session's record of its cases, or None when it ended before writing one."""
    path = record_dir / SESSION_REPORT
    if not path.is_file():
        return None
    try:
        report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return report
    except ValueError as exc:
        raise MsprofError(f"{path}: not a session record ({exc})") from None


# ---------------------------------------------------------------------------- controller side
@dataclass
class ExternalOutcome:
    records: dict[str, CaseRecord] = field(default_factory=dict)
    results: list[CaseResult] = field(default_factory=list)
    failed: int = 0
    workers: int = 0
    notes: list[str] = field(default_factory=list)




def external_run(
    mode: str,
    cases: Sequence[tuple[str, "Case"]],
    *,
    repeat_count: int,
    warmup_count: int,
    prof_path: Path | None = None,
    argv: Sequence[str] = (),
    cwd: str | Path = ".",
    output_root: str | Path = "msprof_output",
    environ: Mapping[str, str] | None = None,
) -> ExternalOutcome:
    """The controller's part: launch the session under msprof (or read ``prof_path``), match.

    ``cases`` are the collected (node id, case) pairs.  Raises MsprofError with one line when
    nothing can be measured; nothing is written by this function.
    """
    from perf_plugin.run.cases import record_of

    outcome = ExternalOutcome()
    kernel_types = {case.ref.kernel_type for _, case in cases}
    if mode == MODE_READ:
        if prof_path is None:
            raise MsprofError("--perf-prof-path is required to read a profile")
        prof_dirs = [Path(prof_path)]
        measured = as_measured((case for _, case in cases), repeat_count)
        records = {nodeid: record_of(case, "passed" if case.runnable else "skipped") for nodeid, case in cases}
        outcome.notes.append(f"msprof: read {prof_path} (no replay ran; each case taken as {repeat_count} repeats)")
    else:
        runnable = {case.ref.kernel_type for _, case in cases if case.runnable}
        problem = custom_opp_message(os.environ if environ is None else environ, runnable)
        if problem is not None:
            raise MsprofError(problem)
        sessions = _Sessions(argv, cwd, output_root, environ, repeat_count, outcome)
        prof_dirs, records, measured = _run_session(sessions, cases)

    try:
        match = match_profile(
            prof_dirs, measured, repeat_count, warmup_count, unmatched_kernel_types=kernel_types
        )
    except MsprofError as exc:
        raise MsprofError(f"{exc}; nothing was written") from None
    outcome.notes.extend(match.notes)
    failed_cases = {r.ref.case_id: r.reason for r in match.results if r.outcome == OUTCOME_FAILED}
    for nodeid, record in records.items():
        if record.outcome == "passed" and record.ref.case_id in failed_cases:
            record = dataclasses.replace(record, outcome="failed", message=failed_cases[record.ref.case_id])
        outcome.records[nodeid] = record
    outcome.results.extend(match.results)
    outcome.failed = sum(1 for r in outcome.records.values() if r.outcome == "failed")
    measured_count = sum(1 for r in match.results if r.has_duration and not r.ref.case_id.startswith("msprof:"))
    extra = sum(1 for r in match.results if r.ref.case_id.startswith("msprof:"))
    outcome.notes.append(
        f"msprof: {match.rows} op_summary rows; {measured_count} case(s) measured, "
        f"{len(failed_cases)} without samples, {extra} unmatched kernel signature(s)"
    )
    return outcome


@dataclass
class _Sessions:
    """What every session under msprof of one run is launched with, and where its results go."""

    argv: Sequence[str]
    cwd: str | Path
    output_root: str | Path
    environ: Mapping[str, str] | None
    repeat_count: int
    outcome: ExternalOutcome

    def launch(self, label: str = "", deselect: Sequence[str] = ()) -> LaunchOutcome:
        return run_under_msprof(
            self.argv, cwd=self.cwd, output_root=self.output_root, environ=self.environ, label=label, deselect=deselect
        )


Collected = tuple[list[Path], dict[str, CaseRecord], list[MeasuredCase]]


def _ended_early(launch: LaunchOutcome, session: str = "the session under msprof", then: str = "") -> str:
    """``session`` ended before recording its results; ``then``; where msprof's output is."""
    return (
        f"{session} ended (exit code {launch.returncode}) before recording its results{then} "
        f"(msprof output: {launch.output_dir})"
    )


def _run_session(sessions: _Sessions, cases: Sequence[tuple[str, "Case"]]) -> Collected:
    """Launch the session under msprof: its profile directories, its case records, and the
    cases it measured in launch order (its results and notes go into the outcome)."""
    launch = sessions.launch()
    report = _read_child_report(launch.record_dir)
    if report is None:
        if launch.returncode == 0 or not any(case.runnable for _, case in cases):
            raise MsprofError(_ended_early(launch, then="; nothing was written"))
        return _run_each_kernel_type(sessions, cases, launch)
    if not launch.prof_dirs:
        raise MsprofError(f"msprof wrote no PROF_* directory under {launch.output_dir}; nothing was written")
    records, measured = _session_cases(report, launch.record_dir, sessions)
    sessions.outcome.notes.append(
        f"msprof: the session ran under msprof (exit code {launch.returncode}); profile "
        f"{', '.join(str(p) for p in launch.prof_dirs)} (re-read it with --perf-prof-path {launch.output_dir})"
    )
    return list(launch.prof_dirs), records, measured


def _session_cases(
    report: dict[str, Any], record_dir: Path, sessions: _Sessions
) -> tuple[dict[str, CaseRecord], list[MeasuredCase]]:
    """A recorded session's case records and measured cases (its results go into the outcome)."""
    outcome = sessions.outcome
    records = {nodeid: CaseRecord.from_json(data) for nodeid, data in report.get("records", {}).items()}
    outcome.results.extend(CaseResult.from_json(data) for data in report.get("results", []))
    outcome.workers = max(outcome.workers, int(report.get("workers", 0)))
    measured = read_measured(record_dir)
    logged = {m.ref.case_id for m in measured}
    # A passed case the log does not name (a child without the msprof collector) ran the
    # nominal repeats after everything logged.
    last = max((m.order for m in measured), default=0)
    for index, record in enumerate(records.values(), start=1):
        if record.outcome == "passed" and record.ref.case_id not in logged:
            measured.append(MeasuredCase(record.ref, sessions.repeat_count, last + index))
    return records, measured


def _run_each_kernel_type(sessions: _Sessions, cases: Sequence[tuple[str, "Case"]], whole: LaunchOutcome) -> Collected:
    """The whole session ended before recording: each kernel type with a case to run runs in a
    session of its own.  One that ends early too fails its own cases with the reason; the
    profiles of the others are matched as one (the sessions ran one after another)."""
    from perf_plugin.run.cases import record_of

    by_type: dict[str, list[tuple[str, Case]]] = defaultdict(list)
    for nodeid, case in cases:
        by_type[case.ref.kernel_type].append((nodeid, case))
    prof_dirs: list[Path] = []
    records: dict[str, CaseRecord] = {}
    measured: list[MeasuredCase] = []
    recorded: list[str] = []
    lost: list[str] = []
    for kernel_type, own in sorted(by_type.items()):
        if not any(case.runnable for _, case in own):  # nothing to launch: skipped, as the session would
            records.update((nodeid, record_of(case, "skipped")) for nodeid, case in own)
            continue
        mine = {nodeid for nodeid, _ in own}
        launch = sessions.launch(kernel_type, [nodeid for nodeid, _ in cases if nodeid not in mine])
        report = _read_child_report(launch.record_dir)
        if report is None:
            reason = _ended_early(launch, f"the session under msprof of {kernel_type} alone")
            for nodeid, case in own:
                record = record_of(case, "failed" if case.runnable else "skipped")
                records[nodeid] = dataclasses.replace(record, message=reason) if case.runnable else record
            lost.append(f"{kernel_type} (exit code {launch.returncode})")
            continue
        own_records, own_measured = _session_cases(report, launch.record_dir, sessions)
        records.update(own_records)
        measured.extend(own_measured)
        prof_dirs.extend(launch.prof_dirs)
        recorded.append(kernel_type)
    if not recorded:
        raise MsprofError(
            f"{_ended_early(whole)}, and so did the session of each kernel type alone: {', '.join(lost)}; "
            "nothing was written"
        )
    if not prof_dirs:
        raise MsprofError(f"msprof wrote no PROF_* directory for {', '.join(recorded)}; nothing was written")
    sessions.outcome.notes.append(
        f"msprof: {_ended_early(whole)}; each kernel type then ran in a session of its own: "
        f"{', '.join(recorded)} recorded"
        + (f"; {', '.join(lost)} ended before recording too, their cases failed" if lost else "")
        + f"; profiles {', '.join(str(p) for p in prof_dirs)}"
    )
    return prof_dirs, records, measured
