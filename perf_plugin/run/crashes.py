"""Cases that kill their process, and the measurements that process took with it.

A replay can take its process down (``abort``, a segfault, a CUDA illegal address, the device's
out-of-memory killer).  Under pytest-xdist the controller sees the worker go down and the case it
was running reported as failed; xdist starts a replacement worker and the run goes on.  Two
things are then missing, and this module supplies them:

* the cause: each worker writes Python's fault handler output (``Fatal Python error: Aborted``,
  ``Segmentation fault``, with the Python stack) to a file of its own, which the controller reads
  into the crashed case's failure and its record;
* the measurements: a worker sends its results per profiler batch, so the cases that passed on
  it since its last batch are lost with it.  They are found at the end of the run (passed, no
  result) and measured again in one more session restricted to them (``--perf-case-ids-file``),
  which writes them back itself; the case that crashed is not run again.
"""

from __future__ import annotations

import faulthandler
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import pytest

from perf_plugin.run.state import CaseRecord

FAULT_DIR_KEY = "perf_fault_dir"  # workerinput key: where each worker writes its fault log
RERUN_ENV = "PERF_LOST_CASES_RERUN"  # set in the re-run session, which never starts another
CRASH_MARK = "crashed while running"  # xdist's words in the report of a case that took its worker down
MAX_STACK_LINES = 6


def fault_log(directory: str | Path, worker_id: str) -> Path:
    return Path(directory) / f"{worker_id}.fault.txt"


def enable_fault_log(path: Path) -> IO[str]:
    """Send this process's fault handler output to ``path`` (kept open until the process ends)."""
    handle = path.open("w", encoding="utf-8")
    faulthandler.enable(file=handle, all_threads=False)
    return handle


def crash_cause(path: Path | None) -> str:
    """The fault handler's first line and the innermost Python frames, or what is known."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace") if path is not None else ""
    except OSError:
        text = ""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    fatal = next((line for line in lines if line.startswith("Fatal Python error")), None)
    if fatal is None:
        return "the process died without a Python fault report (killed by a signal, or the out-of-memory killer)"
    frames = [line.strip() for line in lines if line.lstrip().startswith("File ")][:MAX_STACK_LINES]
    return "; ".join([fatal, *frames])


def worker_was_interrupted(worker: Any) -> bool:
    """Whether an xdist worker ended its session interrupted (Ctrl-C, or the SIGINT xdist stops a
    busy worker with): xdist then reports the case it was running as a crash, which it was not."""
    output = getattr(worker, "workeroutput", None)
    return isinstance(output, dict) and output.get("exitstatus") == int(pytest.ExitCode.INTERRUPTED)


def interrupted_case_report(nodeid: str) -> tuple[str, None, str]:
    """A skip's ``longrepr`` for the case an interrupt stopped: not measured, left for the next run."""
    return (nodeid.split("::")[0], None,
            "Skipped: interrupted while it ran, not measured (--perf-update-mode missing-only measures it)")


def is_crash_report(longrepr: object) -> bool:
    return isinstance(longrepr, str) and CRASH_MARK in longrepr


def lost_case_ids(records: Iterable[CaseRecord], measured: Mapping[str, object]) -> list[str]:
    """Cases reported passed whose measurement never arrived: lost with a crashed worker."""
    return sorted({r.ref.case_id for r in records if r.outcome == "passed" and r.ref.case_id not in measured})


def rerun_lost_cases(
    case_ids: Sequence[str], argv: Sequence[str], cwd: str | Path, ids_file: Path, python: str = sys.executable
) -> int:
    """Run ``python -m pytest argv`` again for ``case_ids`` only; its output goes to this terminal."""
    ids_file.parent.mkdir(parents=True, exist_ok=True)
    ids_file.write_text("".join(f"{case_id}\n" for case_id in case_ids), encoding="utf-8")
    environ = {**os.environ, RERUN_ENV: "1"}
    # one argument: pytest picks its rootdir before it knows this option, and would take a
    # separate path argument for a test path (another rootdir, other node ids)
    command = [python, "-m", "pytest", *argv, f"--perf-case-ids-file={ids_file}"]
    return subprocess.run(command, cwd=cwd, env=environ, check=False).returncode


def read_case_ids(path: Path) -> set[str]:
    """The ids ``--perf-case-ids-file`` lists (blank lines and ``#`` comments ignored)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the case ids file: {exc.strerror}") from None
    return {line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")}
