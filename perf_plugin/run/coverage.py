"""The replay-coverage gate: which fraction of the selected rows replayed and passed.

A row counts as *covered* when its case has a replay and passed.  With ``--collect-only`` no
case runs, so coverage is the fraction of selected rows that have a replay at all (and can be
built).  Coverage is counted two ways: by rows, and by the profiled time of the rows
(``Profiling Average Duration(us)`` times ``Profiling Count``: the share of a profiled model's
kernel time that the run can measure); ``--perf-replay-coverage-weight`` says which one the gate
uses.  A database without profiled durations has no time to weigh: its time coverage is the
row coverage.  Collective benchmarks are not rows and do not count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from perf_plugin.run.cases import STATUS_READY
from perf_plugin.run.state import CaseRecord

WEIGHT_ROWS = "rows"
WEIGHT_TIME = "time"
WEIGHTS = (WEIGHT_ROWS, WEIGHT_TIME)


@dataclass
class KernelCoverage:
    kernel_type: str
    selected: int = 0
    with_replay: int = 0
    passed: int = 0
    selected_us: float = 0.0  # profiled time of the selected rows
    with_replay_us: float = 0.0
    passed_us: float = 0.0

    def fraction(self, collect_only: bool, weight: str = WEIGHT_ROWS) -> float:
        if weight == WEIGHT_TIME and self.selected_us > 0:
            return (self.with_replay_us if collect_only else self.passed_us) / self.selected_us
        if not self.selected:
            return 1.0
        return (self.with_replay if collect_only else self.passed) / self.selected


def coverage_by_kernel(records: Iterable[CaseRecord]) -> dict[str, KernelCoverage]:
    table: dict[str, KernelCoverage] = {}
    for record in records:
        entry = table.setdefault(record.ref.kernel_type, KernelCoverage(record.ref.kernel_type))
        entry.selected += 1
        entry.selected_us += record.weight_us
        if record.status == STATUS_READY:
            entry.with_replay += 1
            entry.with_replay_us += record.weight_us
            if record.outcome == "passed":
                entry.passed += 1
                entry.passed_us += record.weight_us
    return dict(sorted(table.items()))


def overall_fraction(table: dict[str, KernelCoverage], collect_only: bool, weight: str = WEIGHT_ROWS) -> float:
    total = KernelCoverage("all")
    for entry in table.values():
        for name in ("selected", "with_replay", "passed", "selected_us", "with_replay_us", "passed_us"):
            setattr(total, name, getattr(total, name) + getattr(entry, name))
    return total.fraction(collect_only, weight)


def format_coverage(table: dict[str, KernelCoverage], collect_only: bool) -> list[str]:
    last = "with replay" if collect_only else "passed"
    width = max([len("kernel type")] + [len(k) for k in table])
    lines = [
        f"{'kernel type':<{width}}  {'rows':>6}  {'replay':>6}  {'passed':>6}  {last + ' %':>12}  {'of time %':>9}"
    ]
    for name, entry in table.items():
        passed = "-" if collect_only else str(entry.passed)
        time_share = f"{100 * entry.fraction(collect_only, WEIGHT_TIME):>8.1f}%" if entry.selected_us > 0 else f"{'-':>9}"
        lines.append(
            f"{name:<{width}}  {entry.selected:>6}  {entry.with_replay:>6}  {passed:>6}"
            f"  {100 * entry.fraction(collect_only):>11.1f}%  {time_share}"
        )
    return lines
