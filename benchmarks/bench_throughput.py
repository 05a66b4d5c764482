"""Small cases per second on one device, side by side in one run, and the harness's peak memory.

Five sides replay the same small rows (an Add of a few thousand fp32 elements, ``--repeats``
timed repeats after 5 warm-ups, verified once):

* **bare loop**: the replays alone in a Python loop, no profiler and no pytest (inputs, check,
  warm-up, repeats, a device synchronisation per case): the floor under any harness;
* **bare loop, this collector**: the same loop under this version's collector, still no pytest:
  minus the bare loop, what the profiler costs per case;
* **empty pytest tests**: as many empty parametrized tests through pytest, without its log
  capture as a replay run has it: pytest's own cost per test;
* **harness**: ``pytest bench`` as a user runs it, with this version's collector;
* **harness, previous collector**: the same ``pytest bench``, its collector swapped (through the
  ``pytest_perf_make_collector`` hook) for the one this version replaced.  On CUDA that one
  recorded CPU operators and runtime calls as well as device activity, inside a labelled range
  per case; on the CPU it recorded for the whole batch (set-up, check and warm-up included) with
  a range per repeat.  Its attribution is this version's, so only the recording differs.

Each side runs in a fresh process per round and is timed in its steady state (after the first
tenth of the cases: no start-up, collection, first calls or write-back); the sides alternate in
each round and the medians over rounds are printed.  Then, with ``--memory-rows``, ``pytest
bench`` runs once per row count on rows all of one shape (the bookkeeping per row, without
tensors that grow with the row number) and its peak RSS and wall time are printed.

Prerequisites: a CPU, or an NVIDIA GPU with torch built for CUDA (``--backend cuda``); this
project installed (``pip install -e .``), run from a checkout of the repository.

    python benchmarks/bench_throughput.py --backend cuda --cases 3000 --rounds 3
    python benchmarks/bench_throughput.py --backend cuda --cases 3000 --memory-rows 10000,100000
    python benchmarks/bench_throughput.py --backend cpu --cases 1000 --rounds 2 --memory-rows 10000

Expected output: a line per round, then a table of the five sides (ms per case, cases per
second, ratio to the bare loop), what the profiler, pytest and the plugin each add per case and
the floor of a harness with this collector and, with ``--memory-rows``, a line per row count with the
harness's peak RSS (the target for 100,000 rows is under 1.5 GiB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import CHILD_EMPTY_TESTS, STEADY_CLOCK, write_database  # noqa: E402  (a sibling script)

ROOT = Path(__file__).resolve().parents[1]

# The collector this version replaced, rebuilt on this version's: only what it records differs.
PREVIOUS_COLLECTOR = textwrap.dedent(
    """
    from perf_plugin.profiling.torch_profiler import TorchProfilerCollector
    class PreviousCollector(TorchProfilerCollector):
        def __init__(self, backend, batch_size):
            on_cpu = backend.marker() is None
            super().__init__(backend, batch_size=batch_size, repeat_markers=on_cpu)  # CPU: a range per repeat
            self._toggles = False  # recording on for the whole batch
            if not on_cpu:
                from torch.profiler import ProfilerActivity
                self._activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        def _run_between_markers(self, number, run_once, repeats, before_repeat):
            with self._range("perfcase::" + str(number)):  # the labelled range per case
                super()._run_between_markers(number, run_once, repeats, before_repeat)
    class PreviousCollectorPlugin:
        def pytest_perf_make_collector(self, backend, settings):
            return PreviousCollector(backend, settings.profile_batch_size)
    """
)

CHILD_PYTEST = "import time as _time\n" + STEADY_CLOCK + PREVIOUS_COLLECTOR + textwrap.dedent(
    """
    import json, resource, sys, time
    import pytest, torch
    db, backend, repeats, out, side = sys.argv[1:6]
    plugins = [CLOCK] + ([PreviousCollectorPlugin()] if side == "previous" else [])
    start = time.perf_counter()
    code = pytest.main([BENCH, "--perf-database-path", db, "--perf-backend", backend, "--perf-repeat-count", repeats,
                        "-q", "-p", "no:cacheprovider", "--no-header", "-o", "console_output_style=classic"],
                       plugins=plugins)
    wall = time.perf_counter() - start
    json.dump({"wall": wall, "code": int(code), "steady": CLOCK.result(),
               "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, open(out, "w"))
    """
)

CHILD_BARE = textwrap.dedent(
    """
    import json, resource, sys, time
    from pathlib import Path
    import torch
    from perf_plugin.backends.select import resolve_backend
    from perf_plugin.replay.registry import get_replay
    from perf_plugin.run.cases import load_case_set
    from perf_plugin.run.runner import ReplayRunner
    db, backend_name, repeats, out, side = sys.argv[1:6]

    class NoProfiler:
        kind = "in-process"
        def __init__(self, backend):
            self.backend = backend
        def measure(self, ref, run_once, repeats, before_repeat=None):
            for _ in range(repeats):
                run_once()
            self.backend.synchronize()  # as a profiler's attribution needs the work done
        def drain(self):
            return []
        def finish(self):
            return []

    backend = resolve_backend(backend_name)
    if side == "collector":  # the same loop under this version's collector, no pytest
        from perf_plugin.profiling.torch_profiler import TorchProfilerCollector
        collector = TorchProfilerCollector(backend, batch_size=32)
    else:
        collector = NoProfiler(backend)
    runner = ReplayRunner(backend, collector, int(repeats), 5)
    cases = load_case_set(Path(db), get_replay).cases
    skip = len(cases) // 10
    start = time.perf_counter()
    for index, case in enumerate(cases):
        if index == skip:
            steady_start = time.perf_counter()
        runner.run(case)
        collector.drain()
    end = time.perf_counter()
    json.dump({"wall": end - start, "code": 0, "steady": [end - steady_start, len(cases) - skip],
               "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, open(out, "w"))
    """
)

SIDES = {"bare": ("bare loop (no profiler)", CHILD_BARE), "collector": ("bare loop, this collector", CHILD_BARE),
         "empty": ("empty pytest tests", CHILD_EMPTY_TESTS.format(extra=[])), "harness": ("harness", CHILD_PYTEST),
         "previous": ("harness, previous collector", CHILD_PYTEST)}


def run_side(side: str, db: Path, backend: str, repeats: int, scratch: Path) -> dict:
    source = SIDES[side][1].replace("BENCH", repr(str(ROOT / "bench" / "test_kernels.py")))
    script, out = scratch / f"{side}.py", scratch / f"{side}.json"
    script.write_text(source)
    subprocess.run([sys.executable, str(script), str(db), backend, str(repeats), str(out), side], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, env=os.environ.copy())
    return json.loads(out.read_text())


def throughput(args: argparse.Namespace, scratch: Path) -> None:
    db = scratch / "db"
    db.mkdir()
    write_database(db, args.cases)
    per_case: dict[str, list[float]] = {side: [] for side in SIDES}
    codes: dict[str, int] = {}
    for round_number in range(args.rounds):
        for side in SIDES:
            outcome = run_side(side, db, args.backend, args.repeats, scratch)
            seconds, cases = outcome["steady"]
            per_case[side].append(seconds / cases)
            codes[side] = outcome["code"]
        print(f"round {round_number + 1}: " + ", ".join(f"{side} {1e3 * per_case[side][-1]:.3f} ms" for side in SIDES),
              flush=True)
    bare = median(per_case["bare"])
    print(f"\nbackend={args.backend} cases={args.cases} repeats={args.repeats} rounds={args.rounds} "
          f"(steady state, medians); exit codes {codes}")
    print(f"{'':32}{'ms/case':>10}{'cases/s':>10}{'x bare':>9}")
    for side, (label, _) in SIDES.items():
        seconds = median(per_case[side])
        print(f"{label:32}{1e3 * seconds:>10.3f}{1 / seconds:>10.0f}{seconds / bare:>9.2f}")
    print_floor({side: median(seconds) for side, seconds in per_case.items()})


def print_floor(ms: dict[str, float]) -> None:
    """What each layer adds per case, and the least a harness built of these layers can cost."""
    profiler = ms["collector"] - ms["bare"]
    plugin = ms["harness"] - ms["collector"] - ms["empty"]
    floor = ms["bare"] + profiler + ms["empty"]
    print(f"per case: profiler {1e3 * profiler:.3f} ms (collector loop - bare), pytest's own {1e3 * ms['empty']:.3f} "
          f"ms (an empty test), the plugin {1e3 * plugin:.3f} ms (harness - collector loop - empty test)")
    print(f"floor with this collector and no plugin work: bare + profiler + empty test = {1e3 * floor:.3f} ms "
          f"({1 / floor:.0f} cases/s)")
    print("target: the harness at most 2 ms per small case (500 cases/s) on an H100 host")


def memory(args: argparse.Namespace, scratch: Path) -> None:
    for rows in args.memory_rows:
        db = scratch / f"memory-{rows}"
        db.mkdir()
        write_database(db, rows, one_shape=True)
        outcome = run_side("harness", db, args.backend, args.repeats, scratch)
        print(f"harness, {rows} rows of one shape: peak RSS {outcome['rss'] / 2**20:.0f} MiB, wall "
              f"{outcome['wall']:.1f} s ({rows / outcome['wall']:.0f} cases/s), exit code {outcome['code']}", flush=True)
    print("target: under 1536 MiB (1.5 GiB) at 100,000 rows")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cases", type=int, default=2000, help="rows of the throughput sides (0: none)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are printed")
    parser.add_argument("--memory-rows", type=lambda text: [int(n) for n in text.split(",") if n], default=[],
                        help="comma-separated row counts for the peak-RSS runs, e.g. 10000,100000")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.cases:
            throughput(args, Path(tmp))
        if args.memory_rows:
            memory(args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
