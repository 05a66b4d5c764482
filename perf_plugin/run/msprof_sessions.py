"""The sessions under msprof of an NPU run: the command, the launch, and what each session records.

The controller (``perf_plugin.run.msprof_launch``) decides which sessions to launch and matches
their profiles; this module launches one (``run_under_msprof``: ``msprof <options> python
[launcher] -m pytest <arguments>``, where the launcher is empty for the main session and
torchrun for the expert-parallel one, ``perf_plugin.run.ep_session``), and reads back what the
session recorded.  The session's side: ``write_child_report`` at its end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perf_plugin.database.atomic import atomic_write_text
from perf_plugin.profiling.msprof import (
    CHILD_ENV,
    OUTPUT_ENV,
    RECORD_ENV,
    SESSION_REPORT,
    MeasuredCase,
    MsprofError,
    is_recording_rank,
    read_measured,
)
from perf_plugin.results import CaseResult
from perf_plugin.run.state import CaseRecord

if TYPE_CHECKING:
    from perf_plugin.run.state import RunState

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


def msprof_command(
    msprof: str, output_dir: str | Path, argv: Sequence[str], python: str, launcher: Sequence[str] = ()
) -> list[str]:
    """``msprof --output=<dir> <options> <python> [launcher] -m pytest <argv>`` (the app at the end,
    as documented; ``launcher``: ``-m torch.distributed.run --nnodes ...`` for torchrun)."""
    output = str(output_dir)
    bad = sorted(set(output) & _FORBIDDEN_PATH_CHARACTERS)
    if bad:
        raise MsprofError(f"msprof output directory {output!r} contains characters msprof refuses: {''.join(bad)!r}")
    return [msprof, f"--output={output}", *MSPROF_OPTIONS, python, *launcher, "-m", "pytest", *argv]


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
    launcher: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
) -> LaunchOutcome:
    """Run ``python [launcher] -m pytest argv`` under msprof in a fresh output directory; return where it wrote.

    ``label`` ends the directory's name; the node ids in ``deselect`` are left out of the session
    (``--deselect`` lines of ``deselect.args`` in that directory); ``extra_env`` is added to the
    session's environment.  The child inherits this process's standard streams, so its progress
    shows as it runs.
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
    arguments = [*argv, f"@{args_file}"] if deselect else list(argv)
    command = msprof_command(msprof, output_dir, arguments, python, launcher)
    record_dir.mkdir(parents=True, exist_ok=True)
    if deselect:
        args_file.write_text("".join(f"--deselect={nodeid}\n" for nodeid in deselect), encoding="utf-8")
    environ.update(extra_env or {})
    environ[CHILD_ENV] = "1"
    environ[RECORD_ENV] = str(record_dir)
    completed = subprocess.run(command, cwd=str(cwd), env=environ, check=False)
    return LaunchOutcome(completed.returncode, output_dir, record_dir, find_prof_dirs(output_dir))


# ---------------------------------------------------------------------------- child side
def write_child_report(state: "RunState", record_dir: str | Path | None = None) -> Path | None:
    """In the session under msprof: record outcomes and failures for the parent (no write-back)."""
    if record_dir is None and not is_recording_rank():
        return None  # another rank of the expert-parallel session: rank 0 records for all of them
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


def read_child_report(record_dir: Path) -> dict[str, Any] | None:
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


@dataclass
class Sessions:
    """What every session under msprof of one run is launched with, and where its results go.

    ``excluded``: node ids left out of every main session (the expert-parallel session's cases)."""

    argv: Sequence[str]
    cwd: str | Path
    output_root: str | Path
    environ: Mapping[str, str] | None
    repeat_count: int
    outcome: ExternalOutcome
    excluded: Sequence[str] = ()

    def launch(self, label: str = "", deselect: Sequence[str] = ()) -> LaunchOutcome:
        return run_under_msprof(
            self.argv, cwd=self.cwd, output_root=self.output_root, environ=self.environ, label=label,
            deselect=[*deselect, *self.excluded],
        )  # fmt: skip


Collected = tuple[list[Path], dict[str, CaseRecord], list[MeasuredCase]]


def ended_early(launch: LaunchOutcome, session: str = "the session under msprof", then: str = "") -> str:
    """``session`` ended before recording its results; ``then``; where msprof's output is."""
    return (
        f"{session} ended (exit code {launch.returncode}) before recording its results{then} "
        f"(msprof output: {launch.output_dir})"
    )


def session_cases(
    report: dict[str, Any], record_dir: Path, sessions: Sessions
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


@dataclass
class Part:
    """One session's share of the run (or a profile read): what to match, against which cases.

    ``device``: only op_summary rows of this device are matched (the expert-parallel session's
    rank 0); None: every device's.  ``group_size``: the process group its collective kernels ran
    in (1 in a main session; None for a profile read, where nothing says)."""

    prof_dirs: list[Path]
    records: dict[str, CaseRecord]
    measured: list[MeasuredCase]
    kernel_types: set[str]
    group_size: int | None = 1
    device: str | None = None
    label: str = ""
    notes: list[str] = field(default_factory=list)
