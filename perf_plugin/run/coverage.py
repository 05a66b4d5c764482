"""The replay-coverage gate: which fraction of the selected rows replayed and passed.

A row counts as *covered* when its case has a replay and passed.  With ``--collect-only`` no
case runs, so coverage is the fraction of selected rows that have a replay at all (and can be
built).  Coverage is counted two ways: by rows, and by the profiled time of the rows
(``Profiling Average Duration(us)`` times ``Profiling Count``: the share of a profiled model's
kernel time that the run can measure); ``--perf-replay-coverage-weight`` says which one the gate
uses.  A row without a profiled time weighs nothing by time, and the coverage line says how many
such rows there are; where no selected row has one, coverage by time cannot be measured at all:
the line says so, and a gate by time fails rather than quietly counting rows instead.  Collective
benchmarks are not rows and do not count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from perf_plugin.run.cases import STATUS_READY
from perf_plugin.run.state import CaseRecord

WEIGHT_ROWS = "rows"
WEIGHT_TIME = "time"
WEIGHTS = (WEIGHT_ROWS, WEIGHT_TIME)

PROFILED_TIME = "Profiling Average Duration(us) x Profiling Count"
NO_PROFILED_TIME = f"no selected row has a profiled time ({PROFILED_TIME}): coverage by time cannot be measured"


@dataclass
class KernelCoverage:
    kernel_type: str
    selected: int = 0
    with_replay: int = 0
    passed: int = 0
    profiled: int = 0  # selected rows with a profiled time (the rows coverage by time weighs)
    selected_us: float = 0.0  # profiled time of the selected rows
    with_replay_us: float = 0.0
    passed_us: float = 0.0

    def fraction(self, collect_only: bool, weight: str = WEIGHT_ROWS) -> float | None:
        """The covered share by ``weight``; None by time when no row has a profiled time (there
        is nothing to weigh, and counting rows instead would pass a time gate unmeasured)."""
        if weight == WEIGHT_TIME:
            if self.selected_us <= 0:
                return None
            return (self.with_replay_us if collect_only else self.passed_us) / self.selected_us
        return self.row_fraction(collect_only)

    def row_fraction(self, collect_only: bool) -> float:
        """The covered share of the rows (always defined: 1.0 when none is selected)."""
        if not self.selected:
            return 1.0
        return (self.with_replay if collect_only else self.passed) / self.selected


def coverage_by_kernel(records: Iterable[CaseRecord]) -> dict[str, KernelCoverage]:
    table: dict[str, KernelCoverage] = {}
    for record in records:
        entry = table.setdefault(record.ref.kernel_type, KernelCoverage(record.ref.kernel_type))
        entry.selected += 1
        entry.selected_us += record.weight_us
        if record.weight_us > 0:
            entry.profiled += 1
        if record.status == STATUS_READY:
            entry.with_replay += 1
            entry.with_replay_us += record.weight_us
            if record.outcome == "passed":
                entry.passed += 1
                entry.passed_us += record.weight_us
    return dict(sorted(table.items()))


def total_coverage(table: dict[str, KernelCoverage]) -> KernelCoverage:
    total = KernelCoverage("all")
    for entry in table.values():
        for name in ("selected", "with_replay", "passed", "profiled", "selected_us", "with_replay_us", "passed_us"):
            setattr(total, name, getattr(total, name) + getattr(entry, name))
    return total


def time_part(total: KernelCoverage, collect_only: bool) -> str:
    """What the coverage line says of the profiled time, saying plainly which rows it leaves out."""
    fraction = total.fraction(collect_only, WEIGHT_TIME)
    if fraction is None:
        return NO_PROFILED_TIME
    share = f"{100 * fraction:.1f}%"
    if total.profiled == total.selected:
        return f"{share} of their profiled time"
    missing = total.selected - total.profiled
    return (
        f"{share} of the profiled time of the {total.profiled} rows that have one;"
        f" {missing} selected row(s) have no profiled time ({PROFILED_TIME}) and do not count by time"
    )


def gate_line(
    table: dict[str, KernelCoverage], collect_only: bool, minimum: float, weight: str
) -> tuple[str, bool]:
    """The coverage line of a run with ``--perf-replay-coverage-min``, and whether the gate failed.

    A gate by time where no selected row has a profiled time fails: it cannot be measured, and a
    CI gate that passes unmeasured would hide exactly the database it was meant to catch."""
    total = total_coverage(table)
    rows = total.row_fraction(collect_only)
    by_time = total.fraction(collect_only, WEIGHT_TIME)
    gated = by_time if weight == WEIGHT_TIME else rows
    failed = gated is None or gated < minimum
    verdict = "fails" if gated is None else "below" if failed else "meets"
    what = "have a replay" if collect_only else "replayed and passed"
    joint = "; " if by_time is None else ", "  # the sentence of no profiled time stands on its own
    line = (
        f"replay coverage: {100 * rows:.1f}% of {total.selected} selected rows {what}{joint}{time_part(total, collect_only)}"
        f" ({verdict} --perf-replay-coverage-min {minimum:g} by {weight})"
    )
    return line, failed


def format_coverage(table: dict[str, KernelCoverage], collect_only: bool) -> list[str]:
    last = "with replay" if collect_only else "passed"
    width = max([len("kernel type")] + [len(k) for k in table])
    lines = [
        f"{'kernel type':<{width}}  {'rows':>6}  {'replay':>6}  {'passed':>6}  {last + ' %':>12}  {'of time %':>9}"
    ]
    for name, entry in table.items():
        passed = "-" if collect_only else str(entry.passed)
        share = entry.fraction(collect_only, WEIGHT_TIME)
        time_share = f"{100 * share:>8.1f}%" if share is not None else f"{'-':>9}"
        lines.append(
            f"{name:<{width}}  {entry.selected:>6}  {entry.with_replay:>6}  {passed:>6}"
            f"  {100 * entry.row_fraction(collect_only):>11.1f}%  {time_share}"
        )
    return lines
