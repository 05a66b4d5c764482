"""Per-process run state, kept in ``config.stash``.

The controller (the process pytest was started as) owns the database location, the collected
results and write-back; each process that runs tests (the controller without xdist, or every
xdist worker) owns a backend, a collector and a runner, created lazily by the session fixture.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from perf_plugin.database.paths import DatabaseLocation
from perf_plugin.options import Settings
from perf_plugin.results import CaseResult

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend
    from perf_plugin.cases import CaseSet
    from perf_plugin.profiling.collector import Collector


@dataclass
class CaseRecord:
    """What the controller learns about one selected compute case from its reports."""

    case_id: str
    kernel_type: str
    csv_file: str
    row_line: int | None
    status: str
    reason: str
    signature_key: str
    outcome: str = ""  # passed / failed / skipped (from the test reports)
    message: str = ""


@dataclass
class RunState:
    settings: Settings
    location: DatabaseLocation
    backend_name: str
    device_name: str
    started: float = field(default_factory=time.time)
    started_perf: float = field(default_factory=time.perf_counter)
    notes: list[str] = field(default_factory=list)  # lines for the terminal summary
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
