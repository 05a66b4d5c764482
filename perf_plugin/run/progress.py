"""Progress of a long run, in pytest's own terminal: cases done of total, rate, ETA, per device.

pytest's progress column says how far the run is; on a run of 100,000 rows a person also wants
how fast it goes and when it ends, and, with one xdist worker per device, whether every device is
busy.  Every ``--perf-progress-interval`` seconds (default 30; 0 turns it off) the controller
writes one line through pytest's terminal reporter:

    perf: 41250/100000 tests (41.2%), 512.3/s, ETA 1m35s; gw0 10400, gw1 10250, gw2 10300, gw3 10300
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from perf_plugin.run.controller_hooks import CASE_PROPERTY


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def progress_line(done: int, total: int, elapsed_s: float, per_worker: Counter[str]) -> str:
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    share = f" ({100 * done / total:.1f}%)" if total else ""
    eta = f", ETA {format_duration((total - done) / rate)}" if rate > 0 and total >= done else ""
    workers = "; " + ", ".join(f"{name} {count}" for name, count in sorted(per_worker.items())) if len(per_worker) > 1 else ""
    return f"perf: {done}/{total or '?'} tests{share}, {rate:.1f}/s{eta}{workers}"


class ProgressHooks:
    """Controller: counts finished tests (local or from workers) and writes a line now and then."""

    def __init__(self, config: pytest.Config, interval_s: float) -> None:
        self.config = config
        self.interval_s = interval_s
        self.total = 0
        self.done = 0
        self.per_worker: Counter[str] = Counter()
        self.started = time.perf_counter()
        self.last_line = self.started
        self.replay_seen = False

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not hasattr(self.config, "workerinput"):
            self.total = max(self.total, len(session.items))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.total = max(self.total, len(ids))  # every worker collects the whole (selected) run

    def pytest_runtestloop(self, session: pytest.Session) -> None:
        self.started = self.last_line = time.perf_counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown" and not (report.failed and report.when not in ("setup", "call")):
            return  # one count per test: its teardown (or the report of a test whose worker died)
        self.done += 1
        if not self.replay_seen:  # an unrelated project's run gets no line from this plugin
            self.replay_seen = any(name == CASE_PROPERTY for name, _ in report.user_properties)
        worker = getattr(getattr(report, "node", None), "gateway", None)
        self.per_worker[worker.id if worker is not None else "local"] += 1
        now = time.perf_counter()
        if self.replay_seen and self.interval_s > 0 and now - self.last_line >= self.interval_s:
            self.last_line = now
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                if reporter._tw.width_of_current_line:  # noqa: SLF001  (after a row of progress dots)
                    reporter.write("\n")
                reporter.write_line(progress_line(self.done, self.total, now - self.started, self.per_worker))
