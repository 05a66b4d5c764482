"""The replay-coverage gate: which fraction of the selected rows replayed and passed.

A row counts as *covered* when its case has a replay and passed.  With ``--collect-only`` no
case runs, so coverage is the fraction of selected rows that have a replay at all (and are not
quarantined).  Collective benchmarks are not rows and do not count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from perf_plugin.cases import STATUS_READY
from perf_plugin.session import CaseRecord


@dataclass
class KernelCoverage:
    kernel_type: str
    selected: int = 0
    with_replay: int = 0
    passed: int = 0

    def fraction(self, collect_only: bool) -> float:
        if not self.selected:
            return 1.0
        return (self.with_replay if collect_only else self.passed) / self.selected


def coverage_by_kernel(records: Iterable[CaseRecord]) -> dict[str, KernelCoverage]:
    table: dict[str, KernelCoverage] = {}
    for record in records:
        entry = table.setdefault(record.ref.kernel_type, KernelCoverage(record.ref.kernel_type))
        entry.selected += 1
        if record.status == STATUS_READY:
            entry.with_replay += 1
            if record.outcome == "passed":
                entry.passed += 1
    return dict(sorted(table.items()))


def overall_fraction(table: dict[str, KernelCoverage], collect_only: bool) -> float:
    selected = sum(e.selected for e in table.values())
    if not selected:
        return 1.0
    covered = sum((e.with_replay if collect_only else e.passed) for e in table.values())
    return covered / selected


def format_coverage(table: dict[str, KernelCoverage], collect_only: bool) -> list[str]:
    last = "with replay" if collect_only else "passed"
    width = max([len("kernel type")] + [len(k) for k in table])
    lines = [f"{'kernel type':<{width}}  {'rows':>6}  {'replay':>6}  {'passed':>6}  {last + ' %':>12}"]
    for name, entry in table.items():
        passed = "-" if collect_only else str(entry.passed)
        lines.append(
            f"{name:<{width}}  {entry.selected:>6}  {entry.with_replay:>6}  {passed:>6}"
            f"  {100 * entry.fraction(collect_only):>11.1f}%"
        )
    return lines
