"""The object behind the ``perf_runner`` fixture: runs a case and turns outcomes into pytest's.

It lives in each process that runs tests.  Failures become CaseResults immediately (in the
outbox); measurements arrive from the collector in batches.  Both are attached to test reports
by the plugin, so they reach the controller under pytest-xdist.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from perf_plugin.results import OUTCOME_FAILED, CaseResult
from perf_plugin.run.cases import Case
from perf_plugin.run.case_outcomes import CaseFailure, CaseSkip
from perf_plugin.run.runner import ReplayRunner
from perf_plugin.run.state import TesterState


@dataclass
class CaseExecutor:
    tester: TesterState
    runner: ReplayRunner

    def replay(self, case: Case) -> None:
        if not case.runnable:
            pytest.skip(f"{case.status}: {case.reason}")
        try:
            self.runner.run(case)
        except CaseSkip as exc:
            pytest.skip(str(exc))
        except CaseFailure as exc:
            self.tester.outbox.append(
                CaseResult(case.ref, OUTCOME_FAILED, reason=str(exc), backend=self.runner.backend.name)
            )
            pytest.fail(f"{case.ref.case_id}: {exc}", pytrace=False)
