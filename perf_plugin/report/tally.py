"""Counting a run's cases once, for every report.

The markdown report, the JSON run report and the coverage table all count the same things:
how many database rows a kernel type had in the run and what became of each.  A row reaches
the summary either as a ``CaseResult`` (it ran, or was skipped / had no replay) or as a
``QuarantinedRow`` (it could not become a replay case).  A quarantined row that also has a
result is counted once, as quarantined.

The kernel type of a case is the one of the CSV it came from (``CaseResult.kernel_type``), not
the one the profiler reported: counts are about the database's rows.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from perf_plugin.results import (
    OUTCOME_NO_REPLAY,
    OUTCOME_PASSED,
    OUTCOME_QUARANTINED,
    OUTCOME_SKIPPED,
    OUTCOME_UNSUPPORTED,
    CaseResult,
    QuarantinedRow,
    RunSummary,
)


@dataclass
class KernelTally:
    """What became of the rows of one kernel type."""

    kernel_type: str
    rows: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    no_replay: int = 0
    unsupported: int = 0  # the replay cannot build the row
    quarantined: int = 0
    # ``Average Duration(us)`` (the mean of the steady-state samples) of each measured case.
    averages_us: list[float] = field(default_factory=list)

    @property
    def replayed(self) -> int:
        """Cases whose replay ran to a verdict (passed or failed)."""
        return self.passed + self.failed

    @property
    def with_replay(self) -> int:
        """Rows that have a replay: everything but quarantined, unsupported and no-replay rows."""
        return self.rows - self.no_replay - self.unsupported - self.quarantined

    @property
    def median_average_us(self) -> float | None:
        return statistics.median(self.averages_us) if self.averages_us else None

    def add(self, outcome: str) -> None:
        self.rows += 1
        if outcome == OUTCOME_PASSED:
            self.passed += 1
        elif outcome == OUTCOME_SKIPPED:
            self.skipped += 1
        elif outcome == OUTCOME_NO_REPLAY:
            self.no_replay += 1
        elif outcome == OUTCOME_UNSUPPORTED:
            self.unsupported += 1
        elif outcome == OUTCOME_QUARANTINED:
            self.quarantined += 1
        else:
            # ``failed`` and anything unexpected: a case that did not demonstrably pass.
            self.failed += 1


@dataclass
class RunTally:
    kernels: dict[str, KernelTally]

    def total(self, attribute: str) -> int:
        return sum(getattr(k, attribute) for k in self.kernels.values())

    @property
    def rows(self) -> int:
        return self.total("rows")


def quarantined_kernel_type(row: QuarantinedRow) -> str:
    return row.ref.kernel_type or Path(row.ref.csv_file).stem


def mean_duration(result: CaseResult) -> float | None:
    """The value written to ``Average Duration(us)`` for this result (``SampleStats.mean``: the
    arithmetic mean of the samples), if it measured anything."""
    return statistics.fmean(result.samples_us) if result.samples_us else None


def tally_cases(results: Iterable[CaseResult], quarantined: Iterable[QuarantinedRow] = ()) -> RunTally:
    kernels: dict[str, KernelTally] = {}

    def entry(kernel_type: str) -> KernelTally:
        return kernels.setdefault(kernel_type, KernelTally(kernel_type))

    # a row is one (file, line, signature): a case id may differ between a record and a result
    quarantined_keys: set[tuple[str, int | None, str]] = set()
    for row in quarantined:
        key = (row.ref.csv_file, row.ref.row_line, row.ref.signature_key)
        if key in quarantined_keys:
            continue
        quarantined_keys.add(key)
        entry(quarantined_kernel_type(row)).add(OUTCOME_QUARANTINED)
    for result in results:
        key = (result.ref.csv_file, result.ref.row_line, result.ref.signature_key)
        if key in quarantined_keys:
            continue  # already counted from the quarantine list
        if result.outcome == OUTCOME_QUARANTINED:
            quarantined_keys.add(key)
        tally = entry(result.ref.kernel_type)
        tally.add(result.outcome)
        average = mean_duration(result)
        if average is not None:  # write-back writes every measurement, whatever the outcome
            tally.averages_us.append(average)
    return RunTally(dict(sorted(kernels.items())))


def tally_summary(summary: RunSummary) -> RunTally:
    return tally_cases(summary.results, summary.quarantined)
