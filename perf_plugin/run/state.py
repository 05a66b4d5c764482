"""Per-process run state, kept in ``config.stash``.

The controller (the process pytest was started as) owns the database location, the collected
results and write-back; each process that runs tests (the controller without xdist, or every
xdist worker) owns a backend, a collector and a runner, created lazily by the session fixture.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from perf_plugin.database.paths import DatabaseLocation
from perf_plugin.options import Settings
from perf_plugin.results import CaseRef, CaseResult

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend
    from perf_plugin.profiling.collector import Collector
    from perf_plugin.run.cases import CaseSet


@dataclass(frozen=True)
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
class RunState:
    settings: Settings
    location: DatabaseLocation
    backend_name: str
    device_name: str
    started: float = field(default_factory=time.time)
    started_perf: float = field(default_factory=time.perf_counter)
    notes: list[str] = field(default_factory=list)  # lines for the terminal summary
    header_shown: bool = False  # the "perf:" lines of the report header were printed
    case_set: "CaseSet | None" = None
    # controller side
    records: dict[str, CaseRecord] = field(default_factory=dict)
    results: dict[str, CaseResult] = field(default_factory=dict)
    workers: int = 0
    # process that runs tests
    backend: "Backend | None" = None
    collector: "Collector | None" = None
    outbox: list[CaseResult] = field(default_factory=list)
    unsent_notes: list[str] = field(default_factory=list)  # worker notes not yet sent to the controller
    heap_refrozen: bool = False  # the heap was frozen again after the first replay (plugin._freeze_heap)


RUN_STATE = pytest.StashKey[RunState]()
