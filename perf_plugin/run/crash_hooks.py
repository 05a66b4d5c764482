"""Hooks around worker crashes (``perf_plugin.run.crashes`` says what happens and why).

Registered in every process of a run: the controller hands each xdist worker a directory for its
fault log, records a crashed case with its cause, and at the end re-measures the cases a crashed
worker took with it; a worker sends its fault handler output to its file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

import pytest

from perf_plugin.results import OUTCOME_FAILED, CaseResult
from perf_plugin.run.crashes import (
    FAULT_DIR_KEY,
    RERUN_ENV,
    crash_cause,
    enable_fault_log,
    fault_log,
    interrupted_case_report,
    lost_case_ids,
    rerun_lost_cases,
    worker_was_interrupted,
)
from perf_plugin.run.setup import is_worker
from perf_plugin.run.state import RUN_STATE, CaseRecord, RunState


def isolate_in_worker(config: pytest.Config) -> bool:
    """``--perf-isolate`` without ``-n``: one xdist worker runs the cases, so a case that takes its
    process down is recorded and the worker replaced (xdist's ``--max-worker-restart``), as with
    ``-n N``.  Called before xdist reads its options (or after: both outcomes are set here)."""
    from perf_plugin.options import resolve_settings
    from perf_plugin.run.expert_parallel import in_ep_session

    if not resolve_settings(config).isolate or config.getoption("numprocesses", None) or is_worker(config):
        return False
    if in_ep_session():  # a rank of the expert-parallel session runs its cases itself, with the others
        return False
    config.option.numprocesses = 1
    if getattr(config.option, "dist", "no") == "no":
        config.option.dist = "load"
    config.option.tx = ["popen"]
    return True


def _case_by_param_id(state: RunState, config: pytest.Config, nodeid: str) -> Any:
    """The case of ``nodeid`` (``...[<case id>]``), reading the database here if no test did."""
    from perf_plugin.run.cases import collect_case_set

    if state.case_set is None:  # the xdist controller collects no test: read the rows once, now
        answers = config.hook.pytest_perf_replay_modules(config=config)
        collect_case_set(state, [module for modules in answers for module in modules])
    assert state.case_set is not None
    param_id = nodeid.rsplit("[", 1)[-1].rstrip("]")
    return next((case for case in state.case_set.cases if case.ref.case_id == param_id), None)


class CrashHooks:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.fault_dir: Path | None = None
        self.crashed: dict[str, str] = {}  # node id -> cause
        self._fault_handle: Any = None

    @property
    def state(self) -> RunState | None:
        return self.config.stash.get(RUN_STATE, None)

    # --------------------------------------------------------------------------------- worker
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Worker: fault handler output to this worker's file (after pytest's own set-up, which
        points it at stderr, where the controller cannot read it)."""
        workerinput = getattr(self.config, "workerinput", None)
        if workerinput and workerinput.get(FAULT_DIR_KEY):
            self._fault_handle = enable_fault_log(fault_log(workerinput[FAULT_DIR_KEY], workerinput["workerid"]))

    # ----------------------------------------------------------------------------- controller
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        if self.fault_dir is None:
            self.fault_dir = Path(tempfile.mkdtemp(prefix="perf-worker-faults-"))
        node.workerinput[FAULT_DIR_KEY] = str(self.fault_dir)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """A case took its worker down: its failure says why, and it is recorded as failed.  A
        case an interrupt stopped is reported skipped, not measured: it left for the next run."""
        if worker_was_interrupted(getattr(report, "node", None)):
            report.outcome = "skipped"
            # (path, None, reason): pytest's own skips without a line carry None, which its type omits
            report.longrepr = cast(Any, interrupted_case_report(crashitem))
            return
        worker = getattr(getattr(report, "node", None), "gateway", None)
        path = fault_log(self.fault_dir, worker.id) if self.fault_dir is not None and worker is not None else None
        cause = crash_cause(path)
        report.longrepr = f"{report.longrepr}: {cause}"
        self.crashed[crashitem] = cause
        state = self.state
        if state is None or state.controller is None:
            return
        case = _case_by_param_id(state, self.config, crashitem)
        if case is None:
            return
        message = f"the case took its worker down: {cause}"
        state.control.records[crashitem] = CaseRecord(case.ref, case.status, case.reason, "failed", message, case.weight_us)
        state.control.add_result(CaseResult(case.ref, OUTCOME_FAILED, reason=message, backend=state.backend_name))

    def rerun_lost(self, session: pytest.Session) -> None:
        """After write-back: measure again, in one more session, what crashed workers took with them."""
        state = self.state
        if state is None or state.controller is None or not self.crashed or RERUN_ENV in os.environ:
            return
        lost = lost_case_ids(state.control.records.values(), state.control.results)
        if not lost:
            return
        config = session.config
        if self.fault_dir is None:
            self.fault_dir = Path(tempfile.mkdtemp(prefix="perf-worker-faults-"))
        directory = self.fault_dir
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("-", f"measuring again {len(lost)} case(s) lost with crashed workers")
        code = rerun_lost_cases(lost, config.invocation_params.args, config.invocation_params.dir, directory / "lost.ids")
        state.notes.append(
            f"{len(self.crashed)} case(s) took their worker down; {len(lost)} case(s) measured on those workers "
            f"were lost with them and measured again in one more session (exit code {code})"
        )

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """The fault logs served this run only (read when a worker crashed, and by the re-run)."""
        if self.fault_dir is not None:
            shutil.rmtree(self.fault_dir, ignore_errors=True)
            self.fault_dir = None

    # -------------------------------------------------------------------- --perf-case-ids-file
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Process that collects: with ``--perf-case-ids-file``, only the replay cases it lists."""
        from perf_plugin.run.controller_hooks import case_of
        from perf_plugin.run.crashes import read_case_ids

        state = self.state
        if state is None or state.settings.case_ids_file is None:
            return
        try:
            wanted = read_case_ids(state.settings.case_ids_file)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        keep: list[pytest.Item] = []
        drop: list[pytest.Item] = []
        for item in items:
            case = case_of(item)
            (keep if case is None or case.ref.case_id in wanted else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
