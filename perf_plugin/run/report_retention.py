"""Keep only the test reports a summary reads, so a long run's memory stays flat.

pytest's terminal reporter keeps every report it is shown in ``TerminalReporter.stats``, by
category, until the session ends.  A passed setup or teardown report falls in the empty category,
which the summary never counts (pytest skips the empty key when it builds the "N passed" line);
the only reader is ``-rP``'s output of passed tests, and only for a teardown that captured
output.  Yet each report holds its test's keywords, location, sections and timings: two of the
three reports every case leaves behind.  At 20,000 small replay cases on a 2-core x86 host,
letting them go lowered the run's resident memory by 72 MiB (3.6 KB per case; rows of one
shape, measured as ``reproduce/wip/memory_phases.py`` does).

The report is released after every other plugin has seen it (a ``trylast`` hook), and only when
it is the one just added, so nothing else in ``stats`` is touched.
"""

from __future__ import annotations

from typing import Any

import pytest

from perf_plugin.run.state import RUN_STATE

EMPTY_CATEGORY = ""  # the terminal reporter's category of passed setup and teardown reports


def release_uncounted_report(stats: dict[str, list[Any]], report: pytest.TestReport) -> bool:
    """Drop ``report`` from ``stats`` if it is a passed setup or teardown report with no captured
    output and was the last one added there; whether it was dropped."""
    if report.when == "call" or not report.passed or report.sections:
        return False
    reports = stats.get(EMPTY_CATEGORY)
    if not reports or reports[-1] is not report:
        return False
    reports.pop()
    return True


class ReportRelease:
    """Controller (registered in ``pytest_configure``), in a replay run only: drops each uncounted
    report from the terminal reporter as soon as it has been shown."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.config.stash.get(RUN_STATE, None) is None:
            return  # not a replay run: a project's own tests keep pytest's behaviour
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        stats = getattr(reporter, "stats", None)
        if isinstance(stats, dict):
            release_uncounted_report(stats, report)
