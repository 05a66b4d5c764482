"""The whole-run external collector for Ascend NPUs: the session runs under ``msprof``.

On an NPU a replay's duration comes from msprof's ``op_summary`` (``Task Duration(us)`` of every
kernel the device ran), not from an in-process profiler.  Three pieces:

1. **The launch** (controller).  When the backend is ``npu``, no ``--perf-prof-path`` is given and the
   process is not itself the session under msprof, the controller collects the cases but runs
   none: it re-runs the whole pytest session as ``msprof --output=<dir> <msprof options> python
   -m pytest <the same arguments>`` (``msprof_command``), with ``PERF_MSPROF_CHILD=1`` and
   ``PERF_MSPROF_RECORD=<dir>`` in the environment.  That child session runs the replays (under
   pytest-xdist too, if asked) and writes no database file: at its end it records the case
   outcomes in ``<record dir>/session.json``.  The controller then reads every ``PROF_*``
   directory msprof wrote and matches its ``op_summary`` rows to the cases.  With
   ``--perf-prof-path`` nothing is launched and the given profile is read the same way, for the
   collected cases (each assumed to have run ``--perf-repeat-count`` repeats).
   msprof is called in its documented form ``msprof [options] <app>`` (the application and its
   arguments at the end, so no argument is re-split), with ``--task-time=on`` (operator
   durations and their shapes), ``--ai-core=on --aic-mode=task-based
   --aic-metrics=PipeUtilization`` (the per-task counters the database keeps:
   ``aicore_time(us)``, ``aic_mac_time(us)``, ``aiv_time(us)`` ...).  The profile is left under
   ``<rootdir>/msprof_output/run_<timestamp>_<pid>`` (``PERF_MSPROF_OUTPUT`` overrides the root), so
   the run can be re-read later with ``--perf-prof-path``.
2. **The collector** (``MsprofCollector``, in each process that runs tests).  ``measure`` only
   runs the timed repeats (inside an mstx range named after the case, visible when msprof
   collects ``--msproftx``); ``drain``/``finish`` return nothing.  Each measured case is appended
   to ``<record dir>/cases-<pid>.jsonl`` with the number of repeats that ran, so the controller
   knows, per case and in launch order, how many launches to expect.
3. **The matching** (``match_profile`` / ``msprof_results``, controller).

DispatchFFNCombine rows of more than one expert-parallel rank run in a session of their own under
msprof and torchrun, every rank running every such row (``perf_plugin.run.ep_session``).  The
matching rules are in ``perf_plugin.profiling.msprof_match``; the launch and the controller side
in ``perf_plugin.run.msprof_launch``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perf_plugin.results import CaseRef, CaseResult

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend

CHILD_ENV = "PERF_MSPROF_CHILD"  # "1" in the session msprof runs: it must not launch msprof again
RECORD_ENV = "PERF_MSPROF_RECORD"  # where that session records its cases and outcomes
OUTPUT_ENV = "PERF_MSPROF_OUTPUT"  # root of the msprof output directories (default <rootdir>/msprof_output)
# "1" in every rank of the expert-parallel session under msprof (perf_plugin.run.ep_session): its
# collective rows run on every rank, and rank 0 alone records what ran (its device's op_summary
# rows are the ones matched).
EP_SESSION_ENV = "PERF_EP_SESSION"

MODE_LAUNCH = "launch"
MODE_READ = "read"
SESSION_REPORT = "session.json"
CASE_LOG_PREFIX = "cases-"
MSTX_MESSAGE_BYTES = 150  # mstx messages are limited to 156 bytes outside MSPTI


class MsprofError(Exception):
    """The msprof run or its output cannot be used; the message is one line for the user."""


# ============================================================================ the collector
@dataclass(frozen=True)
class MeasuredCase:
    """A case whose timed repeats ran in a process profiled by msprof."""

    ref: CaseRef
    repeats: int
    order: int = 0  # time.time_ns() when the repeats finished: launch order across processes

    def to_json(self) -> dict[str, Any]:
        return {"ref": self.ref.to_json(), "repeats": self.repeats, "order": self.order}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MeasuredCase":
        return cls(CaseRef.from_json(data["ref"]), int(data["repeats"]), int(data.get("order", 0)))


def _mstx() -> Any:
    """torch_npu's mstx ranges, or None where torch_npu is missing (imported lazily)."""
    try:
        from perf_plugin.backends.npu import import_torch_npu

        return import_torch_npu().npu.mstx
    except Exception:  # noqa: BLE001 - labels are a convenience, never a reason to fail
        return None


def _label(case_id: str) -> str:
    return f"perf::{case_id}".encode()[:MSTX_MESSAGE_BYTES].decode(errors="ignore")


class MsprofCollector:
    """Runs the repeats; msprof records the kernels.  Results come at session end (controller)."""

    kind = "external"

    def __init__(self, backend: "Backend", record_dir: str | Path | None = None) -> None:
        self.backend = backend
        self.measured: list[MeasuredCase] = []
        record = record_dir if record_dir is not None else os.environ.get(RECORD_ENV)
        if record_dir is None and not is_recording_rank():
            record = None  # another rank of an expert-parallel session: rank 0 records the cases
        self.log_path = Path(record) / f"{CASE_LOG_PREFIX}{os.getpid()}.jsonl" if record else None
        self._mstx = _mstx() if backend.collector == "msprof" else None

    def measure(
        self,
        ref: CaseRef,
        run_once: Callable[[], Any],
        repeats: int,
        before_repeat: Callable[[], Any] | None = None,
    ) -> None:
        range_id = self._range_start(ref.case_id)
        ran = 0
        try:
            for _ in range(repeats):
                if before_repeat is not None:
                    before_repeat()
                run_once()
                ran += 1
        finally:
            self._range_end(range_id)
            self._record(MeasuredCase(ref, ran, time.time_ns()))

    def drain(self) -> list[CaseResult]:
        return []

    def finish(self) -> list[CaseResult]:
        return []

    def _record(self, measured: MeasuredCase) -> None:
        self.measured.append(measured)
        if self.log_path is None:
            return
        # One line per case, appended and closed at once: a worker that crashes later loses
        # nothing already recorded.
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(measured.to_json()) + "\n")

    def _range_start(self, case_id: str) -> int | None:
        if self._mstx is None:
            return None
        try:
            return int(self._mstx.range_start(_label(case_id), None))
        except Exception:  # noqa: BLE001
            return None

    def _range_end(self, range_id: int | None) -> None:
        if self._mstx is not None and range_id:
            try:
                self._mstx.range_end(range_id)
            except Exception:  # noqa: BLE001, S110 - an unclosed label costs nothing but the label
                pass


def read_measured(record_dir: str | Path) -> list[MeasuredCase]:
    """Every case the processes of the session under msprof measured, in launch order."""
    measured: list[MeasuredCase] = []
    for path in sorted(Path(record_dir).glob(f"{CASE_LOG_PREFIX}*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                measured.append(MeasuredCase.from_json(json.loads(line)))
            except (ValueError, TypeError, KeyError):
                # A worker killed in the middle of a write leaves a partial last line; that case
                # failed (its test never reported), and the rest of the run is still good.
                continue
    return sorted(measured, key=lambda m: (m.order, m.ref.case_id))


# ============================================================================ the matching
def is_recording_rank(environ: Mapping[str, str] | None = None) -> bool:
    """False in a rank other than 0 of an expert-parallel session: its cases are rank 0's too."""
    env = os.environ if environ is None else environ
    return env.get(EP_SESSION_ENV) != "1" or env.get("RANK", "0") == "0"


def is_msprof_child(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(CHILD_ENV) == "1"


def external_mode(prof_path: Path | None, backend_name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``"read"`` with ``--perf-prof-path``, ``"launch"`` on an NPU, None otherwise (and in the child)."""
    if is_msprof_child(environ):
        return None
    if prof_path is not None:
        return MODE_READ
    from perf_plugin.backends.select import backend_class

    if backend_class(backend_name).collector == "msprof":
        return MODE_LAUNCH
    return None


