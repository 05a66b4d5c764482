"""Per-row trace files of a candidate, in the Trace module's naming (seed ``004``):

    log_dir/<op>/I<task>_S<step:02d>_<op>_<action>_<param>.txt

Here ``op`` is the kernel type, the task id is the row's line in its CSV (unique within a kernel
type's file), and the steps are those of judging: step 1 the coder's result (the candidate
file's source, ``DO_CODER_result``), step 2 the verifier's record (``VERIFIER_error_log``: the
verify log, one line per check; ``VERIFIER_profile``: the profile as JSON).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from perf_plugin.database.atomic import atomic_write_text

CODER_STEP = 1
VERIFIER_STEP = 2
CODER_ACTION = "DO_CODER"
VERIFIER_ACTION = "VERIFIER"


def safe_name(text: str) -> str:
    """A file-name part: characters other than letters, digits, ``.``, ``_``, ``-`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"


def trace_name(task: str | int, step: int, op: str, action: str, param: str) -> str:
    return f"I{task}_S{step:02d}_{safe_name(op)}_{action}_{param}.txt"


def write_row_artifacts(
    log_dir: Path, op: str, task: str | int, source: str, verify_log: list[str], profile: dict[str, Any]
) -> list[Path]:
    """The three files of one judged row; returns their paths."""
    directory = log_dir / safe_name(op)
    directory.mkdir(parents=True, exist_ok=True)
    files = [
        (trace_name(task, CODER_STEP, op, CODER_ACTION, "result"), source),
        (trace_name(task, VERIFIER_STEP, op, VERIFIER_ACTION, "error_log"), "\n".join(verify_log) + "\n"),
        (trace_name(task, VERIFIER_STEP, op, VERIFIER_ACTION, "profile"), json.dumps(profile, indent=2) + "\n"),
    ]
    written = []
    for name, text in files:
        path = directory / name
        atomic_write_text(path, text)
        written.append(path)
    return written
