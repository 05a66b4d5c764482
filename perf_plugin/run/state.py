"""Per-process run state, kept in ``config.stash``.

Every process of a run knows its settings, the database location, the device and the cases it
read (``RunState``).  The rest is split by role, as pytest-xdist splits its controller from its
workers: the controller (the process pytest was started as) alone gathers the cases' records and
results and writes back (``ControllerState``); each process that runs tests (the controller
without xdist, or every xdist worker) alone holds a backend, a collector and the results not yet
reported (``TesterState``, created by the session fixture when the first case runs).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from perf_plugin.database.paths import DatabaseLocation
from perf_plugin.options import Settings
from perf_plugin.results import CaseRef, CaseResult
from perf_plugin.run.interrupt import signals_deferred

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend
    from perf_plugin.profiling.collector import Collector
    from perf_plugin.run.cases import CaseSet
    from perf_plugin.run.journal import RunJournal


@dataclass(frozen=True, slots=True)  # one per selected case, held until the run ends
class CaseRecord:
    """What the controller learns about one selected compute case from its reports."""

    ref: CaseRef
    status: str  # the case's collection status (ready, no-replay, quarantined ...)
    reason: str
    outcome: str = ""  # passed / failed / skipped (from the test reports)
    message: str = ""
    weight_us: float = 0.0  # the row's profiled time, for coverage by time

    def to_json(self) -> dict[str, Any]:
        return {
            "ref": self.ref.to_json(),
            "status": self.status,
            "reason": self.reason,
            "outcome": self.outcome,
            "message": self.message,
            "weight_us": self.weight_us,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CaseRecord":
        return cls(
            CaseRef.from_json(data["ref"]),
            str(data["status"]),
            str(data.get("reason", "")),
            str(data.get("outcome", "")),
            str(data.get("message", "")),
            float(data.get("weight_us", 0.0)),
        )


@dataclass
class ControllerState:
    """The controller's: every selected case's record and result, from whichever process ran it."""

    records: dict[str, CaseRecord] = field(default_factory=dict)  # by node id
    results: dict[str, CaseResult] = field(default_factory=dict)  # by case id
    workers: int = 0  # xdist workers (or msprof child workers) that ran cases
    journal: "RunJournal | None" = None  # every result on disk as it arrives (run.journal)
    journal_checked: bool = False  # run.recovery.begin_run ran (a run without a journal too)
    selected_cases: int = 0  # replay cases the run selected (from a worker's collection under xdist)

    def add_result(self, result: CaseResult) -> None:
        self.add_results((result,))

    def add_results(self, results: Iterable[CaseResult]) -> None:
        """Keep a batch of results (journaled first, in one write); a later duration-less result
        never replaces a failure."""
        with signals_deferred():  # a signal between the two would lose a journaled result
            batch = list(results)
            if self.journal is not None:
                self.journal.append(batch)
            for result in batch:
                previous = self.results.get(result.ref.case_id)
                if previous is not None and previous.outcome == "failed" and not result.has_duration:
                    continue
                self.results[result.ref.case_id] = result


@dataclass
class TesterState:
    """A process that runs tests: its device, its collector, and results not yet reported."""

    backend: "Backend"
    collector: "Collector"
    outbox: list[CaseResult] = field(default_factory=list)  # failures, sent with the next report
    heap_refrozen: bool = False  # the heap was frozen again after the first replay (run.heap)
    collector_finished: bool = False  # the collector was flushed for good (take_remaining)

    def take_finished(self) -> list[CaseResult]:
        """Results ready to report: the outbox and what the collector finished measuring."""
        finished = list(self.outbox)
        self.outbox.clear()
        finished.extend(self.collector.drain())
        return finished

    def take_remaining(self) -> list[CaseResult]:
        """Everything not reported yet, the collector flushed for good (end of the session).

        The collector is finished once: a second call (the pytest-benchmark bridge takes the
        results before write-back does) gets only what reached the outbox since.
        """
        remaining = list(self.outbox)
        self.outbox.clear()
        if not self.collector_finished:
            self.collector_finished = True
            remaining.extend(self.collector.finish())
        return remaining


@dataclass
class RunState:
    settings: Settings
    location: DatabaseLocation
    backend_name: str
    device_name: str
    controller: ControllerState | None  # None in an xdist worker
    started: float = field(default_factory=time.time)
    started_perf: float = field(default_factory=time.perf_counter)
    notes: list[str] = field(default_factory=list)  # lines for the terminal summary
    header_shown: bool = False  # the "perf:" lines of the report header were printed
    case_set: "CaseSet | None" = None
    unsent_notes: list[str] = field(default_factory=list)  # an xdist worker's notes not yet sent
    unsent_selection: int | None = None  # an xdist worker's count of selected replay cases, not yet sent
    tester: TesterState | None = None  # set once this process runs its first case
    worker_journal: "RunJournal | None" = None  # an xdist worker's own (run.worker_journal)

    @property
    def control(self) -> ControllerState:
        """The controller's part; asking for it in a worker is a programming error."""
        if self.controller is None:
            raise RuntimeError("an xdist worker holds no controller state")
        return self.controller


RUN_STATE = pytest.StashKey[RunState]()
