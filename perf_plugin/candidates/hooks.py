"""pytest hooks of ``--perf-candidate``: thin, the work is in the package's plain modules.

Registered only when a candidate file is given.  In every process that runs cases the judge
(``tester.CandidateJudge``) is handed to the replay runner and wraps the collector; verdicts and
candidate measurements ride on test reports (and, for what a worker finishes after its last
report, on its ``workeroutput``) to the controller, which scores the run once the database was
written back (``report.finish_candidate_run``).  Candidate durations never reach write-back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from perf_plugin.candidates.baseline import BASELINE_FILE, BaselineError
from perf_plugin.candidates.judge import Verdict
from perf_plugin.candidates.registry import CandidateFileError, load_candidates
from perf_plugin.candidates.report import (
    CandidateRun,
    finish_candidate_run,
    gather_candidate_results,
)
from perf_plugin.candidates.tester import CandidateJudge
from perf_plugin.results import CaseResult

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend
    from perf_plugin.options import Settings
    from perf_plugin.profiling.collector import Collector

PLUGIN_NAME = "perf-candidates"
CANDIDATE_PROPERTY = "perf_candidate"
DEFAULT_LOG_ROOT = "candidate_runs"


def register(config: pytest.Config, settings: "Settings") -> None:
    """pytest_configure: load the candidate file (a bad one stops the run with one line)."""
    if settings.candidate is None:
        return
    try:
        candidates = load_candidates(settings.candidate)
    except CandidateFileError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(CandidateHooks(config, settings, candidates), PLUGIN_NAME)


def attach_judge(config: pytest.Config, backend: "Backend", collector: "Collector") -> tuple["Collector", CandidateJudge | None]:
    """perf_runner: the judge for the runner and the collector it wraps (unchanged without one)."""
    hooks = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if not isinstance(hooks, CandidateHooks):
        return collector, None
    settings = hooks.settings
    judge = CandidateJudge(
        hooks.candidates, backend, settings.candidate_checks, settings.seed, settings.warmup_count, settings.repeat_count
    )
    hooks.judge = judge
    return judge.wrap(collector), judge


def _payload(verdicts: list[Verdict], results: list[CaseResult]) -> dict[str, Any]:
    return {"verdicts": [v.to_json() for v in verdicts], "results": [r.to_json() for r in results]}


class CandidateHooks:
    def __init__(self, config: pytest.Config, settings: "Settings", candidates: dict[str, Any]) -> None:
        self.config = config
        self.settings = settings
        self.candidates = candidates
        self.judge: CandidateJudge | None = None  # in a process that runs cases
        self.verdicts: list[Verdict] = []  # controller: gathered from every process
        self.results: list[CaseResult] = []
        self.lines: list[str] = []
        self.started = time.perf_counter()

    def _take(self) -> dict[str, Any] | None:
        judge = self.judge
        if judge is None:
            return None
        verdicts = judge.take_verdicts()
        results = judge.collector.take_candidates() if judge.collector is not None else []
        return _payload(verdicts, results) if verdicts or results else None

    def _keep(self, payload: dict[str, Any]) -> None:
        self.verdicts.extend(Verdict.from_json(v) for v in payload.get("verdicts", []))
        self.results.extend(CaseResult.from_json(r) for r in payload.get("results", []))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when == "teardown":
            payload = self._take()
            if payload is not None:
                report.user_properties.append((CANDIDATE_PROPERTY, payload))
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if hasattr(self.config, "workerinput") or not report.user_properties:
            return
        kept = []
        for name, value in report.user_properties:
            if name == CANDIDATE_PROPERTY:
                self._keep(value)  # type: ignore[arg-type]  # what _take put there
            else:
                kept.append((name, value))
        report.user_properties[:] = kept

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        payload = getattr(node, "workeroutput", {}).get(CANDIDATE_PROPERTY)
        if payload:
            self._keep(json.loads(payload))

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> Generator[None, None, None]:
        # before the run flushes its collector: the candidate measurements still in the profiler
        judge = self.judge
        if judge is not None and judge.collector is not None:
            payload = _payload(judge.take_verdicts(), judge.collector.flush_candidates())
            if hasattr(self.config, "workerinput"):
                self.config.workeroutput[CANDIDATE_PROPERTY] = json.dumps(payload)  # type: ignore[attr-defined]
            else:
                self._keep(payload)
        result = yield
        if not hasattr(self.config, "workerinput") and not self.config.option.collectonly:
            self._finish(session)
        return result

    def _finish(self, session: pytest.Session) -> None:
        from perf_plugin.run.state import RUN_STATE

        settings = self.settings
        assert settings.candidate is not None
        if not self.candidates:
            self.lines = [f"candidate {settings.candidate}: registers no candidate here (nothing judged)"]
            return
        state = self.config.stash.get(RUN_STATE, None)
        if state is None or state.controller is None:
            return
        records = state.control.records.values()
        root = Path(self.config.rootpath) / DEFAULT_LOG_ROOT
        log_dir = settings.candidate_log_dir or root / settings.candidate.stem
        run = CandidateRun(
            candidate_file=settings.candidate,
            source=settings.candidate.read_text(encoding="utf-8", errors="replace"),
            verdicts=sorted(self.verdicts, key=lambda v: (v.kernel_type, v.row_line or 0, v.case_id)),
            candidate_results=gather_candidate_results(self.results),
            reference_results=state.control.results,
            refs={r.ref.case_id: r.ref for r in records},
            weights={r.ref.case_id: r.weight_us for r in records},
            device_key=state.location.device or state.location.directory.name,
            hardware=state.device_name,
            backend=state.backend_name,
            thresholds=settings.candidate_fast_p,
            log_dir=log_dir,
            baseline_path=settings.candidate_baseline or root / BASELINE_FILE,
            elapsed_s=time.perf_counter() - self.started,
        )
        try:
            _, self.lines, _ = finish_candidate_run(run)
        except BaselineError as exc:
            self.lines = [f"candidate run not scored: {exc}"]
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.lines:
            terminalreporter.section("perf candidate")
            for line in self.lines:
                terminalreporter.write_line(line)
