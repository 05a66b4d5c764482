"""Which reports a replay run lets go of: passed setup and teardown reports pytest never counts."""

from __future__ import annotations

from typing import Any

import pytest

from perf_plugin.run.report_retention import EMPTY_CATEGORY, release_uncounted_report


def _report(when: str, outcome: str = "passed", sections: list[tuple[str, str]] | None = None) -> pytest.TestReport:
    return pytest.TestReport(
        "bench/test_kernels.py::test_kernel[Add-8x128]", ("bench/test_kernels.py", 1, "test_kernel"), {}, outcome, None,
        when, sections or [],  # type: ignore[arg-type]
    )


def _shown(stats: dict[str, list[Any]], report: pytest.TestReport, category: str) -> None:
    stats.setdefault(category, []).append(report)  # what the terminal reporter does with each report


@pytest.mark.parametrize("when", ["setup", "teardown"])
def test_a_passed_setup_or_teardown_report_is_released(when: str) -> None:
    stats: dict[str, list[Any]] = {}
    earlier = _report("setup")
    _shown(stats, earlier, EMPTY_CATEGORY)
    report = _report(when)
    _shown(stats, report, EMPTY_CATEGORY)
    assert release_uncounted_report(stats, report)
    assert stats[EMPTY_CATEGORY] == [earlier]  # only the report just shown


def test_reports_a_summary_reads_are_kept() -> None:
    stats: dict[str, list[Any]] = {}
    call = _report("call")
    _shown(stats, call, "passed")
    failed_teardown = _report("teardown", outcome="failed")
    _shown(stats, failed_teardown, "error")
    captured = _report("teardown", sections=[("Captured stdout teardown", "closing\n")])  # -rP shows it
    _shown(stats, captured, EMPTY_CATEGORY)
    assert not any(release_uncounted_report(stats, r) for r in (call, failed_teardown, captured))
    assert stats == {"passed": [call], "error": [failed_teardown], EMPTY_CATEGORY: [captured]}


def test_a_report_that_is_not_the_last_one_shown_stays() -> None:
    stats: dict[str, list[Any]] = {}
    report, later = _report("setup"), _report("teardown")
    _shown(stats, report, EMPTY_CATEGORY)
    _shown(stats, later, EMPTY_CATEGORY)  # another plugin showed one more meanwhile
    assert not release_uncounted_report(stats, report)
    assert stats[EMPTY_CATEGORY] == [report, later]
    assert not release_uncounted_report({}, report)
