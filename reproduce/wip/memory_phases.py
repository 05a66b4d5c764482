"""Where a `pytest bench` run's resident memory goes, phase by phase, on a database of N small rows.

Runs `pytest bench` in this process on a copy of a database of ``--rows`` Add rows all of one
shape (``benchmarks/bench_overhead.py``'s rows), after a one-row run that imports everything a
run imports, and prints the resident set size at configure, when collection has finished, and
at the end, the peak of each phase (sampled every 5 ms by a thread: the run loop, the session's
end, unconfigure), and the peak of each step of the controller's session-end work (summary,
write-back, journal, reports) with the RSS before and after it.  With ``--tracemalloc`` also
the Python allocations alive per row at the end of collection and at the end of the run (minus
collection), by source line: what the rows themselves cost, apart from the allocator's slack.

Prerequisites: this project installed (``pip install -e .``), run from a checkout of the
repository; the CPU backend by default, ``--backend cuda`` on an NVIDIA GPU.

    python reproduce/wip/memory_phases.py --rows 20000
    python reproduce/wip/memory_phases.py --rows 3000 --tracemalloc

Expected output: ``[mem]`` lines (configure, collected, end with the process's peak), a
``[phase]`` line per session-end step and one with the peak per phase, and with
``--tracemalloc`` the 25 largest source lines per row at collection (``[collected]``) and of
the run (``[run]``).  Verification missing: the figures of this version's commit messages came
from an earlier form of this script; this form has run on the CPU only.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_overhead import write_database  # noqa: E402  (a sibling script, not a package)


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PhasePeaks:
    """The highest RSS seen in each phase, sampled by a daemon thread."""

    def __init__(self) -> None:
        self.phase = "start"
        self.peaks: dict[str, float] = {}
        self.step_peak = 0.0
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            now = rss_mib()
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), now)
            self.step_peak = max(self.step_peak, now)
            time.sleep(0.005)

    def wrap(self, module: Any, name: str) -> None:
        """Time-box a session-end step: RSS before, its peak, RSS after."""
        original: Callable[..., Any] = getattr(module, name)

        def step(*args: Any, **kwargs: Any) -> Any:
            before, self.step_peak = rss_mib(), 0.0
            result = original(*args, **kwargs)
            after = rss_mib()
            peak = max(self.step_peak, before, after)  # a step shorter than the sampling interval
            # a line of its own: pytest's progress dots end without a newline
            print(f"\n[phase] {name}: before {before:.0f} peak {peak:.0f} after {after:.0f} MiB")
            return result

        setattr(module, name, step)


class Probe:
    def __init__(self, peaks: PhasePeaks, trace: bool) -> None:
        self.peaks, self.trace, self.items = peaks, trace, 1
        self.collected: tracemalloc.Snapshot | None = None

    def pytest_configure(self) -> None:
        print(f"[mem] configure {rss_mib():.0f} MiB")
        if self.trace:
            tracemalloc.start(8)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = max(len(session.items), 1)
        gc.collect()
        print(f"[mem] collected {len(session.items)} rows: {rss_mib():.0f} MiB")
        if self.trace:
            self.collected = tracemalloc.take_snapshot()
            for stat in self.collected.statistics("lineno")[:25]:
                self._line("collected", stat.size, stat.traceback)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self) -> None:
        self.peaks.phase = "run loop"

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self) -> None:
        self.peaks.phase = "session end"

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self) -> None:
        print(f"[mem] end {rss_mib():.0f} MiB, process peak {peak_mib():.0f} MiB")
        if self.trace and self.collected is not None:
            gc.collect()
            for diff in tracemalloc.take_snapshot().compare_to(self.collected, "lineno")[:25]:
                self._line("run", diff.size_diff, diff.traceback)
            tracemalloc.stop()

    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self) -> None:
        self.peaks.phase = "unconfigure"

    def _line(self, label: str, size: int, traceback: tracemalloc.Traceback) -> None:
        frame = traceback[0]
        print(f"[{label}] {size / self.items:7.0f} B/row  {frame.filename[-70:]}:{frame.lineno}")


def bench_args(database: Path, backend: str) -> list[str]:
    return [str(ROOT / "bench"), "--perf-database-path", str(database), "--perf-backend", backend, "-q",
            "-p", "no:cacheprovider", "--no-header", "-o", "console_output_style=classic"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--tracemalloc", action="store_true", help="Python allocations per row, by source line")
    args = parser.parse_args()
    import perf_plugin.run.controller as controller

    with tempfile.TemporaryDirectory() as tmp:
        warmup, database = Path(tmp, "warmup"), Path(tmp, "db")
        for directory, rows in ((warmup, 1), (database, args.rows)):
            directory.mkdir()
            write_database(directory, rows, one_shape=True)
        pytest.main(bench_args(warmup, args.backend))  # imports what a run imports, before measuring
        shutil.rmtree(warmup)
        peaks = PhasePeaks()
        for step in ("build_summary", "write_back", "settle_journal", "_write_reports"):
            peaks.wrap(controller, step)
        code = pytest.main(bench_args(database, args.backend), plugins=[Probe(peaks, args.tracemalloc)])
    print("[phase] peak per phase: " + ", ".join(f"{name} {value:.0f} MiB" for name, value in peaks.peaks.items()))
    print(f"pytest exit code {int(code)}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
