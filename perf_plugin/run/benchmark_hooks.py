"""The controller hands the measured cases to pytest-benchmark before it saves and compares.

pytest-benchmark saves (``--benchmark-autosave``, ``--benchmark-json``) and checks
``--benchmark-compare-fail`` in its ``pytest_sessionfinish`` hook wrapper, before the other
implementations run, so this one is a wrapper too, and runs first (``tryfirst``): by then the
controller has every case's result, from its own tests or from xdist workers (each worker sends
what it measured with its reports and its last results when it goes down, before the
controller's session finishes).  Results the controller's own collector still holds (the last
profiler batch of a run without xdist) are taken here; write-back then finds them in the
controller's state.

Under xdist pytest-benchmark marks its session disabled, which only stops its own fixture from
timing: the controller's session still saves, writes JSON and compares whatever benchmarks it
holds, and the workers' sessions hold none.  The entries come from the device samples alone.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from perf_plugin.replay.cache_modes import cache_mode_label
from perf_plugin.report import benchmark_bridge
from perf_plugin.run.state import RUN_STATE, RunState


class BenchmarkBridge:
    """Controller only (registered in ``pytest_configure``)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> Generator[None, None, None]:
        feed_benchmark_session(session.config)
        return (yield)


def feed_benchmark_session(config: pytest.Config) -> int:
    """Give pytest-benchmark the run's measured cases, when it is active and asked for something;
    how many were given."""
    state = config.stash.get(RUN_STATE, None)
    bench = benchmark_bridge.benchmark_session(config)
    if state is None or state.controller is None or bench is None or config.option.collectonly:
        return 0
    if not benchmark_bridge.requested(config):
        return 0
    from perf_plugin.profiling.msprof import is_msprof_child

    if is_msprof_child():  # the session under msprof measures nothing itself: its parent gives them
        return 0
    take_pending_results(state)
    shards = config.pluginmanager.get_plugin("perf-shards")
    if shards is not None and not shards.writes_here(state):  # a torchrun rank: rank 0 holds them all now
        return 0
    settings = state.settings
    return benchmark_bridge.add_benchmarks(
        bench,
        state.control.results.values(),
        {node_id: record.ref for node_id, record in state.control.records.items()},
        device_name=state.device_name,
        options=benchmark_bridge.timing_options(
            state.backend_name,
            settings.repeat_count,
            settings.warmup_count,
            cache_mode_label(settings.cache_mode, state.backend_name),
        ),
    )


def take_pending_results(state: RunState) -> None:
    """The controller's own collector's last results into its state (once; write-back reads them there)."""
    if state.tester is None:
        return
    state.control.add_results(state.tester.take_remaining())  # one journal write for the batch
