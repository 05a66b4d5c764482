"""Hooks other pytest plugins (or a project's conftest) implement to extend a replay run.

Registered through ``pytest_addhooks``; implement them as ordinary hook functions:

* ``pytest_perf_replay_modules(config)``: modules (or their dotted names) whose ``OpReplay``
  classes join the kernel catalog for this run, beside the built-in modules and the
  ``perf_plugin.replays`` entry points (a replay that lives in a project, not in a package).
* ``pytest_perf_make_collector(backend, settings)``: a collector for this process's cases
  (``perf_plugin.profiling.collector.Collector``); the first non-None answer wins, None keeps the
  built-in one (torch.profiler, or msprof on an NPU).
* ``pytest_perf_run_finished(config, summary, notes)``: on the controller, once the durations were
  written back and the reports written: ``summary`` is the run's ``RunSummary`` (results, gaps,
  coverage), ``notes`` the lines the terminal summary will print.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend
    from perf_plugin.options import Settings
    from perf_plugin.profiling.collector import Collector
    from perf_plugin.results import RunSummary


@pytest.hookspec
def pytest_perf_replay_modules(config: pytest.Config) -> Sequence[ModuleType | str]:  # type: ignore[empty-body]
    """Modules whose replay classes join the kernel catalog of this run."""


@pytest.hookspec(firstresult=True)
def pytest_perf_make_collector(backend: Backend, settings: Settings) -> Collector | None:
    """The collector that times this process's cases (None: the built-in one)."""


@pytest.hookspec
def pytest_perf_run_finished(config: pytest.Config, summary: RunSummary, notes: list[str]) -> None:
    """The run finished on the controller: durations written back, reports written."""
