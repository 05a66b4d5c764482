"""Per-case overhead of the harness: N small-kernel rows through pytest vs a bare Python loop.

Both sides do the same replays (build inputs, verify once, warm up, timed repeats under the same
in-process profiler collector); the pytest side adds collection, fixtures, reports, result
transport and write-back.  A third side runs N empty parametrized tests through the same pytest
command without pytest's log capture, as a run of replay cases has it (no plugin work, no
replay): pytest's own per-test cost on this host, the floor under the harness's overhead.  Each
side runs in its own fresh process and is timed inside it, three ways: the whole run (torch
already imported), the marginal cost per case (a run of N cases minus one of N/2), and the
steady state (each process timing its cases after the first tenth, so start-up, collection,
first calls and write-back are left out; on noisy hosts the steadiest figure).  Also prints the
time spent in the cyclic garbage collector per case, and the peak RSS and peak device memory of
the pytest process, so runs with different N show whether memory stays flat.

The sides alternate in each round and the medians over rounds are reported: on a shared host
one run of each is not enough to tell a 10 % difference from noise.

Prerequisites: a CPU, or an NVIDIA GPU with torch built for CUDA (``--backend cuda``); this
project installed (``pip install -e .``), run from a checkout of the repository (the pytest side
runs ``bench/test_kernels.py``).

    python benchmarks/bench_overhead.py --backend cpu --cases 1000 --repeats 30
    python benchmarks/bench_overhead.py --backend cuda --cases 3000 --repeats 30 --rounds 3
    python benchmarks/bench_overhead.py --backend cpu --cases 10000 --memory-only
    python benchmarks/bench_overhead.py --backend cpu --cases 20000 --memory-only --one-shape
    python benchmarks/bench_overhead.py --backend cpu --cases 2000 --memory-only --tracemalloc

Expected output: a line per round, then the medians: whole-run wall time, cases/s and peak RSS
of the bare loop and the pytest run and their ratio (target at most 1.2), the marginal cost per
case, pytest's own floor (an empty parametrized test), the steady-state figures docs/measured.md
reports under "Measured" (bare loop and pytest per case, their ratio, cases/s, what the harness
adds beyond pytest's own), the garbage collector's share and pytest's exit code.  With
``--memory-only``: the pytest run's wall time, peak RSS and peak device memory; with
``--tracemalloc`` as well, the Python memory alive at the end of the run minus at collection, per
row, by the code that allocated it: pytest's (``_pytest/*``: items' reports), the plugin's
(``perf_plugin/*``: the run's records and results) and the rest, each with its largest files.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"

# Prepended to every child: time spent in the cyclic garbage collector, by generation, from the
# moment the timed work starts (``GC_STATS["on"] = True``) to its end, through ``gc.callbacks``.
# No braces in it: the pytest children are str.format templates.
GC_RECORDER = textwrap.dedent(
    """
    import gc as _gc, time as _time
    GC_STATS = dict(on=False, started=0.0, seconds=[0.0, 0.0, 0.0], count=[0, 0, 0])
    def _gc_callback(phase, info):
        if not GC_STATS["on"]:
            return
        if phase == "start":
            GC_STATS["started"] = _time.perf_counter()
        else:
            GC_STATS["seconds"][info["generation"]] += _time.perf_counter() - GC_STATS["started"]
            GC_STATS["count"][info["generation"]] += 1
    _gc.callbacks.append(_gc_callback)
    """
)

# Prepended to the pytest children: the steady-state clock, from the start of the first case after
# the first tenth to the end of the last (no start-up, collection, first-call or write-back cost).
# No braces in it either.
STEADY_CLOCK = textwrap.dedent(
    """
    class SteadyClock:
        def __init__(self):
            self.seen, self.skip, self.total, self.start, self.end = 0, 0, 0, 0.0, 0.0
        def pytest_collection_finish(self, session):
            self.total = len(session.items)
            self.skip = self.total // 10
        def pytest_runtest_logstart(self, nodeid, location):
            if self.seen == self.skip:
                self.start = _time.perf_counter()
            self.seen += 1
        def pytest_runtest_logfinish(self, nodeid, location):
            self.end = _time.perf_counter()
        def result(self):
            return [self.end - self.start, self.total - self.skip]
    CLOCK = SteadyClock()
    """
)

# Prepended to the pytest child by --tracemalloc (a str.format template too, hence no braces): a
# one-row session first, untraced, so that the first replay's one-off imports (torch's profiler,
# tens of MiB of module objects, slow to trace) are done before tracing starts; then a plugin that
# starts tracing Python allocations at configure, snapshots the heap when collection has finished
# and again at the very end (terminal summary, trylast: write-back done, reports still held by the
# terminal reporter), and compares the two by traceback.  Each traceback's growth goes to the
# nearest frame, innermost first, in _pytest/ or perf_plugin/ ("other" when neither is among its
# frames), so an allocation in the standard library or a dataclass __init__ counts for the code
# that asked for it.
TRACEMALLOC_PROBE = textwrap.dedent(
    """
    import gc as _tm_gc, re as _tm_re, tracemalloc as _tracemalloc
    import pytest as _tm_pytest
    _TM_PACKAGES = ("/_pytest/", "/perf_plugin/")

    def _tm_short(filename):
        for marker in _TM_PACKAGES:
            if marker in filename:
                return filename[filename.rindex(marker) + 1:]
        return _tm_re.sub(r".*/(site-packages|python3[.][0-9]+)/", "", filename)  # installed or standard library

    def _tm_group(traceback):
        for frame in reversed(traceback):  # tracemalloc orders frames oldest first
            for marker in _TM_PACKAGES:
                if marker in frame.filename:
                    return marker.strip("/") + "/*", _tm_short(frame.filename)
        return "other", _tm_short(traceback[-1].filename)

    class TracemallocProbe:
        def __init__(self, warmup_database):
            self.warmup_database = warmup_database
            self.items, self.collected, self.finished = 0, None, None
        def _snapshot(self):
            _tm_gc.collect()  # cyclic garbage is not alive
            return _tracemalloc.take_snapshot()
        def pytest_configure(self, config):
            # 10 frames: what stays is allocated within a few frames of _pytest/ or perf_plugin/
            # code (the same figures as with 30 at 200 rows, in half the time)
            _tracemalloc.start(10)
        @_tm_pytest.hookimpl(trylast=True)
        def pytest_collection_finish(self, session):
            self.items = len(session.items)
            self.collected = self._snapshot()
        @_tm_pytest.hookimpl(trylast=True)
        def pytest_terminal_summary(self, terminalreporter):
            self.finished = self._snapshot()
            _tracemalloc.stop()
        def result(self):
            groups = dict((name, dict(bytes=0, blocks=0, files=dict())) for name in ("_pytest/*", "perf_plugin/*", "other"))
            for diff in self.finished.compare_to(self.collected, "traceback"):
                if not diff.size_diff:
                    continue
                group, filename = _tm_group(diff.traceback)
                entry = groups[group]
                entry["bytes"] += diff.size_diff
                entry["blocks"] += diff.count_diff
                entry["files"][filename] = entry["files"].get(filename, 0) + diff.size_diff
            return dict(items=self.items, groups=groups)

    TRACEMALLOC = TracemallocProbe(warmup_database={warmup!r})
    """
)

CHILD_PYTEST = GC_RECORDER + STEADY_CLOCK + textwrap.dedent(
    """
    import json, resource, sys, time
    import pytest, torch
    db, backend, repeats, out, cache_mode = sys.argv[1:6]
    probe = globals().get("TRACEMALLOC")  # defined when TRACEMALLOC_PROBE is prepended
    def run_pytest(database, plugins):
        return pytest.main([{bench!r}, "--perf-database-path", database, "--perf-backend", backend,
                            "--perf-repeat-count", repeats, "--perf-cache-mode", cache_mode,
                            "-q", "-p", "no:cacheprovider", "--no-header", "-o", "console_output_style=classic",
                            *{extra!r}], plugins=plugins)
    if probe:
        run_pytest(probe.warmup_database, [])
    GC_STATS["on"] = True
    start = time.perf_counter()
    code = run_pytest(db, [CLOCK] + ([probe] if probe else []))
    wall = time.perf_counter() - start
    GC_STATS["on"] = False
    peak_device = torch.cuda.max_memory_allocated() if backend == "cuda" else 0
    json.dump({{"wall": wall, "code": int(code), "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               "device": peak_device, "gc": GC_STATS, "steady": CLOCK.result(),
               "tracemalloc": probe.result() if probe else None}}, open(out, "w"))
    """
)

CHILD_BARE = GC_RECORDER + textwrap.dedent(
    """
    import json, resource, sys, time
    import torch
    from pathlib import Path
    from perf_plugin.backends.select import resolve_backend
    from perf_plugin.run.cases import load_case_set
    from perf_plugin.profiling.torch_profiler import TorchProfilerCollector
    from perf_plugin.replay.cache_modes import effective_cache_mode
    from perf_plugin.replay.registry import get_replay
    from perf_plugin.run.runner import ReplayRunner
    db, backend_name, repeats, out, cache_mode = sys.argv[1:6]
    GC_STATS["on"] = True
    start = time.perf_counter()
    backend = resolve_backend(backend_name)
    collector = TorchProfilerCollector(backend, batch_size=32)
    runner = ReplayRunner(backend, collector, int(repeats), 5, cache_mode=effective_cache_mode(cache_mode, backend.name))
    results = []
    cases = load_case_set(Path(db), get_replay).cases
    skip = len(cases) // 10  # the steady-state window, as the pytest children's SteadyClock
    for index, case in enumerate(cases):
        if index == skip:
            steady_start = time.perf_counter()
        runner.run(case)
        results.extend(collector.drain())
    steady = [time.perf_counter() - steady_start, len(cases) - skip]
    results.extend(collector.finish())
    wall = time.perf_counter() - start
    GC_STATS["on"] = False
    ok = sum(1 for r in results if r.samples_us)
    json.dump({"wall": wall, "ok": ok, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               "gc": GC_STATS, "steady": steady}, open(out, "w"))
    """
)


CHILD_EMPTY_TESTS = GC_RECORDER + STEADY_CLOCK + textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import pytest, torch
    db, backend, repeats, out, cache_mode = sys.argv[1:6]
    cases = sum(1 for _ in Path(db, "Add.csv").open()) - 1
    test_file = Path(out).with_name("test_empty_cases.py")
    test_file.write_text("import pytest\\n\\n@pytest.mark.parametrize('k', range(%d))\\ndef test_case(k):\\n    pass\\n" % cases)
    GC_STATS["on"] = True
    start = time.perf_counter()
    # -p no:logging: what a run of replay cases does by default (perf_plugin.run.log_capture)
    code = pytest.main([str(test_file), "-q", "-p", "no:cacheprovider", "-p", "no:logging", "--no-header",
                        "-o", "console_output_style=classic", *{extra!r}], plugins=[CLOCK])
    wall = time.perf_counter() - start
    GC_STATS["on"] = False
    json.dump({{"wall": wall, "code": int(code), "gc": GC_STATS, "steady": CLOCK.result()}}, open(out, "w"))
    """
)


def small_shape(k: int) -> tuple[int, int]:
    """Distinct 2-D shapes of at most ~60k elements: kernels of a few microseconds on a GPU."""
    return 1 + k % 97, 128 + 16 * (k // 97)


def write_database(directory: Path, cases: int, one_shape: bool = False) -> None:
    """``cases`` Add rows, of distinct growing shapes or (``one_shape``) all of the first one:
    the second separates what a row costs from what its tensors' sizes cost."""
    rows = []
    for k in range(cases):
        rows_, cols = small_shape(0 if one_shape else k)
        shape = f"{rows_},{cols}"
        rows.append(f'dynamic,AI_VECTOR_CORE,"""{shape};{shape}""",FLOAT;FLOAT,ND;ND,"""{shape}""",FLOAT,ND')
    (directory / "Add.csv").write_text("\n".join([HEADER, *rows]) + "\n")


def run_child(source: str, db: Path, backend: str, repeats: int, scratch: Path, cache_mode: str = "auto",
              env: dict[str, str] | None = None) -> dict:
    out = scratch / "out.json"
    script = scratch / "child.py"
    script.write_text(source)
    subprocess.run([sys.executable, str(script), str(db), backend, str(repeats), str(out), cache_mode], check=True,
                   cwd=ROOT, stdout=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    return json.loads(out.read_text())


def print_gc_share(gc_seconds: dict[str, list[list[float]]], extra_cases: int, last_counts: dict[str, list[int]]) -> None:
    """Time in the cyclic garbage collector per additional case (N minus N/2), by generation."""
    print("cyclic GC per additional case, ms (medians), generations 0/1/2; collections in the last N-case run:")
    for side in ("bare", "pytest", "empty"):
        per_generation = [
            (median(run[g] for run in gc_seconds[side]) - median(run[g] for run in gc_seconds[f"{side}_half"]))
            / extra_cases * 1e3
            for g in range(3)
        ]
        shares = "/".join(f"{value:.3f}" for value in per_generation)
        print(f"  {side:8} {sum(per_generation):.3f} ({shares}); collections {'/'.join(map(str, last_counts[side]))}")


def print_tracemalloc(traced: dict[str, Any]) -> None:
    """Python memory alive at the end minus at collection, per row, by the code that allocated it."""
    rows = traced["items"]
    groups = traced["groups"]
    print(f"tracemalloc, Python memory alive at the end minus at collection, per row ({rows} rows), grouped by "
          "the nearest _pytest/ or perf_plugin/ frame of each allocation's traceback (after an untraced one-row "
          "session), with the largest files:")
    for name, group in groups.items():
        print(f"  {name:14}{group['bytes'] / rows:>8.0f} bytes/row ({group['bytes'] / 2**20:.1f} MiB, "
              f"{group['blocks'] / rows:+.1f} blocks/row)")
        largest = sorted(group["files"].items(), key=lambda item: -abs(item[1]))[:4]
        for filename, size in largest:
            print(f"      {filename}: {size / rows:.0f} bytes/row")
    total = sum(group["bytes"] for group in groups.values())
    print(f"  {'all':14}{total / rows:>8.0f} bytes/row ({total / 2**20:.1f} MiB)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--cache-mode", default="auto", help="--cache-mode of both sides (default: the harness default)")
    parser.add_argument("--pytest-args", default="", help="extra arguments of the pytest side, e.g. '-p no:logging'")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported (default 3)")
    parser.add_argument("--gc-off", action="store_true",
                        help="every side with the cyclic garbage collector disabled (to see its share of the cost)")
    parser.add_argument("--no-plugin-autoload", action="store_true",
                        help="pytest sides load only pytest's own plugins and the perf plugin "
                             "(PYTEST_DISABLE_PLUGIN_AUTOLOAD=1): pytest's cost without the other plugins installed here")
    parser.add_argument("--memory-only", action="store_true", help="only the pytest run: wall time, peak RSS and device memory")
    parser.add_argument("--one-shape", action="store_true",
                        help="with --memory-only: every row of one shape (per-row bookkeeping without growing tensors)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="with --memory-only: trace Python allocations and print, per row, the memory alive at the "
                             "end minus at collection by _pytest/*, perf_plugin/* and other (tracing slows the run and "
                             "adds to its RSS)")
    args = parser.parse_args()
    if args.tracemalloc and not args.memory_only:
        parser.error("--tracemalloc is used with --memory-only")
    pytest_extra = shlex.split(args.pytest_args)
    env: dict[str, str] = {}
    if args.no_plugin_autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        pytest_extra = ["-p", "perf_plugin.plugin", *pytest_extra]
    pytest_child = CHILD_PYTEST.format(bench=str(ROOT / "bench" / "test_kernels.py"), extra=pytest_extra)
    empty_child = CHILD_EMPTY_TESTS.format(extra=shlex.split(args.pytest_args))
    bare_child = CHILD_BARE
    if args.gc_off:
        pytest_child, empty_child, bare_child = ("import gc; gc.disable()\n" + source
                                                 for source in (pytest_child, empty_child, bare_child))
    if args.memory_only:
        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp)
            db = scratch / "db"
            db.mkdir()
            write_database(db, args.cases, args.one_shape)
            if args.tracemalloc:
                warmup = scratch / "warmup"
                warmup.mkdir()
                write_database(warmup, 1)
                pytest_child = TRACEMALLOC_PROBE.format(warmup=str(warmup)) + pytest_child
            harness = run_child(pytest_child, db, args.backend, args.repeats, scratch, args.cache_mode, env)
        print(f"backend={args.backend} cases={args.cases} repeats={args.repeats} pytest wall {harness['wall']:.1f} s "
              f"({args.cases / harness['wall']:.0f} cases/s), exit code {harness['code']}")
        print(f"peak RSS {harness['rss'] / 2**20:.0f} MiB, peak device memory {harness['device'] / 2**20:.1f} MiB"
              f"{' (under tracemalloc: wall time and RSS include the tracing)' if args.tracemalloc else ''}")
        if harness["tracemalloc"] is not None:
            print_tracemalloc(harness["tracemalloc"])
        return 0
    half = args.cases // 2
    walls: dict[str, list[float]] = {"bare": [], "pytest": [], "bare_half": [], "pytest_half": [], "empty": [], "empty_half": []}
    gc_seconds: dict[str, list[list[float]]] = {key: [] for key in walls}
    steady: dict[str, list[float]] = {key: [] for key in walls}  # seconds per case after the first tenth
    last: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        db, half_db = scratch / "db", scratch / "half"
        db.mkdir()
        half_db.mkdir()
        write_database(db, args.cases)
        write_database(half_db, half)
        sides = {"bare": (bare_child, db), "pytest": (pytest_child, db),
                 "bare_half": (bare_child, half_db), "pytest_half": (pytest_child, half_db),
                 "empty": (empty_child, db), "empty_half": (empty_child, half_db)}
        # The sides alternate within each round, so that drifts of a shared, noisy host (other
        # tenants, clocks) fall on both; the medians over rounds are compared.  The half-size
        # runs remove fixed costs (start-up, collection, reports): the difference is the
        # marginal per-case cost of each side.
        for round_number in range(args.rounds):
            last = {key: run_child(source, directory, args.backend, args.repeats, scratch, args.cache_mode, env)
                    for key, (source, directory) in sides.items()}
            for key, outcome in last.items():
                walls[key].append(outcome["wall"])
                gc_seconds[key].append(outcome["gc"]["seconds"])
                seconds, cases = outcome["steady"]
                steady[key].append(seconds / cases)
            print(f"round {round_number + 1}: bare {walls['bare'][-1]:.2f} s, pytest {walls['pytest'][-1]:.2f} s "
                  f"({walls['pytest'][-1] / walls['bare'][-1]:.3f}); at {half} cases bare {walls['bare_half'][-1]:.2f} s, "
                  f"pytest {walls['pytest_half'][-1]:.2f} s; steady state per case bare {1e3 * steady['bare'][-1]:.3f} ms, "
                  f"pytest {1e3 * steady['pytest'][-1]:.3f} ms ({steady['pytest'][-1] / steady['bare'][-1]:.3f})", flush=True)
    bare, harness, harness_half = last["bare"], last["pytest"], last["pytest_half"]
    bare_wall, harness_wall = median(walls["bare"]), median(walls["pytest"])
    extra = args.cases - half
    per_bare = (bare_wall - median(walls["bare_half"])) / extra
    per_harness = (harness_wall - median(walls["pytest_half"])) / extra
    print(f"backend={args.backend} cases={args.cases} repeats={args.repeats} cache mode={args.cache_mode} "
          f"rounds={args.rounds} (medians) pytest args={args.pytest_args!r}{' gc off' if args.gc_off else ''}"
          f"{' plugin autoload off' if args.no_plugin_autoload else ''}")
    print(f"{'':10}{'wall s':>10}{'cases/s':>10}{'peak RSS MiB':>14}")
    print(f"{'bare loop':10}{bare_wall:>10.2f}{args.cases / bare_wall:>10.0f}{bare['rss'] / 2**20:>14.0f}")
    print(f"{'pytest':10}{harness_wall:>10.2f}{args.cases / harness_wall:>10.0f}{harness['rss'] / 2**20:>14.0f}")
    print(f"ratio pytest/bare = {harness_wall / bare_wall:.3f}  (target <= 1.2)   bare loop measured {bare['ok']} cases")
    print(
        f"marginal per case: bare {1e3 * per_bare:.3f} ms, pytest {1e3 * per_harness:.3f} ms, "
        f"ratio {per_harness / per_bare:.3f}  ({1 / per_harness:.0f} cases/s through pytest; target >= 300)"
    )
    per_empty = (median(walls["empty"]) - median(walls["empty_half"])) / extra
    print(f"pytest's own floor: {1e3 * per_empty:.3f} ms per empty parametrized test; the harness adds "
          f"{1e3 * (per_harness - per_bare):.3f} ms per case to the bare loop")
    steady_bare, steady_pytest, steady_empty = (median(steady[side]) for side in ("bare", "pytest", "empty"))
    print(
        f"steady state (the N-case runs after their first tenth), per case: bare {1e3 * steady_bare:.3f} ms, "
        f"pytest {1e3 * steady_pytest:.3f} ms, ratio {steady_pytest / steady_bare:.3f} (target <= 1.2), "
        f"{1 / steady_pytest:.0f} cases/s through pytest (target >= 300); empty tests {1e3 * steady_empty:.3f} ms, "
        f"so the harness adds {1e3 * (steady_pytest - steady_bare - steady_empty):.3f} ms beyond pytest's own"
    )
    print(f"peak RSS at {half} cases: pytest {harness_half['rss'] / 2**20:.0f} MiB (flat memory: close to the above)")
    if args.backend == "cuda":
        print(f"peak device memory (pytest process) = {harness['device'] / 2**20:.1f} MiB")
    print_gc_share(gc_seconds, extra, {key: last[key]["gc"]["count"] for key in last})
    print(f"pytest exit code {harness['code']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
