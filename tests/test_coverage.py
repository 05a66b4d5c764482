"""The replay-coverage line and gate, by rows and by profiled time, without running pytest."""

from __future__ import annotations

import pytest

from perf_plugin.results import CaseRef
from perf_plugin.run.cases import STATUS_NO_REPLAY, STATUS_READY
from perf_plugin.run.coverage import NO_PROFILED_TIME, coverage_by_kernel, format_coverage, gate_line
from perf_plugin.run.state import CaseRecord


def record(line: int, passed: bool, weight_us: float = 0.0) -> CaseRecord:
    ref = CaseRef(f"Add-{line}", "Add", "Add.csv", line, f"sig{line}")
    if passed:
        return CaseRecord(ref, STATUS_READY, "", "passed", weight_us=weight_us)
    return CaseRecord(ref, STATUS_NO_REPLAY, "no replay", "skipped", weight_us=weight_us)


def test_rows_without_profiled_time_say_so_and_a_gate_by_time_fails() -> None:
    table = coverage_by_kernel([record(2, True), record(3, True), record(4, False)])
    line, failed = gate_line(table, False, 0.5, "time")
    assert failed  # never 100 % of a time nobody profiled
    assert line == (
        "replay coverage: 66.7% of 3 selected rows replayed and passed; "
        "no selected row has a profiled time (Profiling Average Duration(us) x Profiling Count): "
        "coverage by time cannot be measured (fails --perf-replay-coverage-min 0.5 by time)"
    )
    # by rows the gate is decided on the rows, and the line still says what it cannot measure
    line, failed = gate_line(table, False, 0.5, "rows")
    assert not failed and NO_PROFILED_TIME in line and line.endswith("(meets --perf-replay-coverage-min 0.5 by rows)")
    assert "100.0%" not in line and format_coverage(table, False)[1].endswith("-")


def test_rows_only_some_of_which_have_a_profiled_time_are_counted_plainly() -> None:
    table = coverage_by_kernel([record(2, True, 30.0), record(3, False, 10.0), record(4, False)])
    line, failed = gate_line(table, False, 0.7, "time")
    assert line == (
        "replay coverage: 33.3% of 3 selected rows replayed and passed, 75.0% of the profiled time of the 2 rows "
        "that have one; 1 selected row(s) have no profiled time (Profiling Average Duration(us) x Profiling Count) "
        "and do not count by time (meets --perf-replay-coverage-min 0.7 by time)"
    )
    assert not failed
    assert gate_line(table, False, 0.8, "time")[1]


@pytest.mark.parametrize("collect_only", [False, True])
def test_every_row_profiled_keeps_the_short_line(collect_only: bool) -> None:
    table = coverage_by_kernel([record(2, True, 30.0), record(3, False, 10.0)])
    line, failed = gate_line(table, collect_only, 0.9, "time")
    assert "50.0% of 2 selected rows" in line and "75.0% of their profiled time (below" in line and failed
