"""The controller's side of a run: what the reports of every test (local or from xdist workers)
carry back, gathered into the run state, and the run under msprof on an NPU.

Results and notes ride on test reports as user properties (``RESULTS_PROPERTY``,
``NOTES_PROPERTY``), the case record on its own teardown report (``CASE_PROPERTY``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Generator
from typing import Any

import pytest

from perf_plugin.replay.cache_modes import effective_cache_mode
from perf_plugin.results import CaseResult
from perf_plugin.run.state import RUN_STATE, CaseRecord, RunState

CASE_FIXTURE = "kernel_case"
RESULTS_PROPERTY = "perf_results"
CASE_PROPERTY = "perf_case"
NOTES_PROPERTY = "perf_notes"
SELECTED_PROPERTY = "perf_selected"  # a worker's count of the replay cases its collection selected
# carried by reports, not about them
TRANSPORT_PROPERTIES = frozenset({RESULTS_PROPERTY, NOTES_PROPERTY, SELECTED_PROPERTY})


def case_of(item: pytest.Item):  # type: ignore[no-untyped-def]
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(CASE_FIXTURE) if callspec is not None else None


class ControllerHooks:
    """Controller only (registered in pytest_configure): gathers cases, outcomes and results."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.outcomes: dict[str, str] = {}

    @property
    def state(self) -> RunState | None:
        """The run's state once the device was identified (None in a run of no replay case)."""
        return self.config.stash.get(RUN_STATE, None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Every report, local or from a worker: outcome, case record, finished results.

        Runs first so that the results and notes, which ride on whichever report was next when
        they were ready (often another case's), are taken off the report before other plugins
        (junitxml, reporters) see them as that test's properties, and are not kept alive with
        the report for the rest of the run.
        """
        state = self.state
        if state is None:
            return
        # what this plugin put there: a record's dict, lists of result dicts and of notes
        properties: dict[str, Any] = dict(report.user_properties) if report.user_properties else {}
        if not TRANSPORT_PROPERTIES.isdisjoint(properties):
            report.user_properties[:] = [p for p in report.user_properties if p[0] not in TRANSPORT_PROPERTIES]
        if report.when in ("setup", "call") and self.outcomes.get(report.nodeid) != "failed":
            if report.failed or report.skipped or report.when == "call":
                self.outcomes[report.nodeid] = "skipped" if report.skipped else report.outcome
        if CASE_PROPERTY in properties and report.nodeid not in state.control.records:
            outcome = self.outcomes.pop(report.nodeid, report.outcome)  # the record keeps it from now on
            if report.failed:
                outcome = "failed"
            record = CaseRecord.from_json(properties[CASE_PROPERTY])
            state.control.records[report.nodeid] = dataclasses.replace(record, outcome=outcome)
        if RESULTS_PROPERTY in properties:  # one batch: journaled in one write
            state.control.add_results(CaseResult.from_json(data) for data in properties[RESULTS_PROPERTY])
        if SELECTED_PROPERTY in properties:  # every worker collects the whole selection
            state.control.selected_cases = max(state.control.selected_cases, int(properties[SELECTED_PROPERTY]))
        for note in properties.get(NOTES_PROPERTY, []):
            if note not in state.notes:
                state.notes.append(note)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        """NPU (msprof) or --perf-prof-path: no test runs here; the replays run in sessions under
        msprof (the collective rows in one of their own, under torchrun), or ran already, and
        their op_summary rows become the results."""
        from perf_plugin.profiling import msprof
        from perf_plugin.run import msprof_launch
        from perf_plugin.run.ep_session import ep_plan

        state, config = self.state, session.config
        if state is None:
            return None
        mode = msprof.external_mode(state.settings.prof_path, state.backend_name)
        if mode is None or config.option.collectonly or session.testsfailed:
            return None  # pytest's own loop (it stops on collection errors)
        cache_mode = effective_cache_mode(state.settings.cache_mode, state.backend_name)
        if cache_mode != "warm" and mode == msprof.MODE_LAUNCH:
            # the flush and the input copies launch kernels of their own, which op_summary
            # would count among the case's launches
            raise pytest.UsageError(f"--perf-cache-mode {cache_mode} is not available under msprof; use warm")
        cases = [(item.nodeid, case) for item in session.items if (case := case_of(item)) is not None]
        try:
            outcome = msprof_launch.external_run(
                mode,
                cases,
                repeat_count=state.settings.repeat_count,
                warmup_count=state.settings.warmup_count,
                prof_path=state.settings.prof_path,
                argv=config.invocation_params.args,
                cwd=config.invocation_params.dir,
                output_root=msprof_launch.default_output_root(config.rootpath),
                ep=ep_plan(state.settings, state.backend_name),
            )
        except msprof.MsprofError as exc:
            raise pytest.UsageError(str(exc)) from None
        state.control.records.update(outcome.records)
        state.control.add_results(outcome.results)
        state.control.workers = max(state.control.workers, outcome.workers)
        state.notes.extend(outcome.notes)
        session.testsfailed = outcome.failed
        return True

    @pytest.hookimpl(wrapper=True, specname="pytest_runtestloop")
    def pytest_runtestloop_stops_after_current_cases(self, session: pytest.Session) -> Generator[None, object, object]:
        """xdist: an interrupt stops the run after each worker's case, so none loses what it measured."""
        if self.state is None:
            return (yield)
        from perf_plugin.run.xdist_stop import stop_after_current_cases

        with stop_after_current_cases(session.config):
            return (yield)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:  # type: ignore[no-untyped-def]
        """xdist: results a worker finished after its last report."""
        payload = getattr(node, "workeroutput", {}).get(RESULTS_PROPERTY)
        state = self.state
        if not payload or state is None:
            return
        state.control.add_results(CaseResult.from_json(data) for data in json.loads(payload))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The selected replay cases counted (under xdist the workers send it); with
        --collect-only they are the records (nothing runs)."""
        state = self.state
        if state is None:
            return
        state.control.selected_cases = max(
            state.control.selected_cases, sum(case_of(item) is not None for item in session.items)
        )
        if not session.config.option.collectonly:
            return
        for item in session.items:
            case = case_of(item)
            if case is not None:
                from perf_plugin.run.cases import record_of

                state.control.records[item.nodeid] = record_of(case)

