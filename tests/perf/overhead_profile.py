"""Where the per-case time goes: the overhead benchmark's sides under cProfile, side by side.

Runs the bare loop, the pytest run and pytest's empty parametrized tests of
``bench_overhead.py`` (same child scripts, same N small-kernel Add rows), each in its own
process under ``cProfile``, and prints for each the functions with the most own time
(``tottime``) and the most time including callees (``cumtime``), in microseconds per
additional case (a run of N cases minus one of N/2, so fixed costs cancel).  cProfile slows Python-heavy code down by up to ~2x, so read the shares, not the totals; the
difference between the pytest and bare columns is what pytest and the plugins add per case.

    python tests/perf/overhead_profile.py --backend cuda --cases 1000 [--top 25]
"""

from __future__ import annotations

import argparse
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import CHILD_BARE, CHILD_EMPTY_TESTS, CHILD_PYTEST, ROOT, write_database  # noqa: E402


# Imports first, unprofiled (they are start-up, not per-case cost), then the child script under
# the profiler.
PROFILED_RUN = """
import cProfile, runpy, sys
import pytest, torch
import perf_plugin.plugin, perf_plugin.run.runner, perf_plugin.profiling.torch_profiler
script, stats_file = sys.argv[1], sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
profiler = cProfile.Profile()
profiler.enable()
try:
    runpy.run_path(script, run_name="__main__")
finally:
    profiler.disable()
    profiler.dump_stats(stats_file)
"""


def profile_child(source: str, db: Path, backend: str, repeats: int, scratch: Path, name: str) -> pstats.Stats:
    script = scratch / f"side_{name}.py"  # not pytest.py: that would shadow pytest itself
    script.write_text(source)
    wrapper = scratch / "profiled_run.py"
    if not wrapper.exists():
        wrapper.write_text(PROFILED_RUN)
    stats_file = scratch / f"side_{name}.prof"
    subprocess.run(
        [sys.executable, str(wrapper), str(script), str(stats_file), str(db), backend, str(repeats),
         str(scratch / f"side_{name}.json"), "auto"],
        check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
    )
    return pstats.Stats(str(stats_file))


def label(function: tuple[str, int, str]) -> str:
    filename, line, name = function
    if filename == "~":
        return name  # a built-in: "<method 'x' of 'y' objects>"
    parts = Path(filename).parts
    for anchor in ("site-packages", "perf_plugin", "lib"):
        if anchor in parts:
            parts = parts[parts.index(anchor) + (anchor != "perf_plugin"):]
            break
    return f"{'/'.join(parts[-3:])}:{line}({name})"


def marginal(full: pstats.Stats, half: pstats.Stats, extra_cases: int, key: int) -> dict[tuple, tuple[float, float]]:
    """function -> (seconds, calls) per additional case: the N-case run minus the N/2-case run.

    Fixed costs (imports, the profiler's first start, collection set-up, reports) cancel out.
    key 2: own time (tottime), 3: time with callees (cumtime), in pstats' tuple layout.
    """
    small = half.stats  # type: ignore[attr-defined]
    result = {}
    for function, entry in full.stats.items():  # type: ignore[attr-defined]
        other = small.get(function, (0, 0, 0.0, 0.0, {}))
        result[function] = ((entry[key] - other[key]) / extra_cases, (entry[1] - other[1]) / extra_cases)
    return result


def print_top(title: str, per_case: dict[tuple, tuple[float, float]], top: int, total: float) -> None:
    print(f"\n{title}: {1e6 * total:.0f} us per additional case in all")
    print(f"{'us/case':>9}{'calls/case':>11}  function")
    for function, (seconds, calls) in sorted(per_case.items(), key=lambda item: -item[1][0])[:top]:
        print(f"{1e6 * seconds:>9.1f}{calls:>11.2f}  {label(function)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    sides = {
        "bare": CHILD_BARE,
        "pytest": CHILD_PYTEST.format(bench=str(ROOT / "bench" / "test_kernels.py"), extra=[]),
        "empty": CHILD_EMPTY_TESTS.format(extra=[]),
    }
    half = args.cases // 2
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for cases in (args.cases, half, 40):
            (scratch / f"db{cases}").mkdir()
            write_database(scratch / f"db{cases}", cases)
        print(f"backend={args.backend}, {args.cases} vs {half} cases, {args.repeats} repeats; under cProfile")
        for name, source in sides.items():
            # a short run first, so that modules imported lazily and compiled on first use (torch
            # ships without some .pyc files) cost neither measured run
            profile_child(source, scratch / "db40", args.backend, args.repeats, scratch, name)
            full = profile_child(source, scratch / f"db{args.cases}", args.backend, args.repeats, scratch, name)
            small = profile_child(source, scratch / f"db{half}", args.backend, args.repeats, scratch, name)
            extra = args.cases - half
            total = (full.total_tt - small.total_tt) / extra  # type: ignore[attr-defined]
            print_top(f"{name}, own time", marginal(full, small, extra, 2), args.top, total)
            print_top(f"{name}, with callees", marginal(full, small, extra, 3), args.top, total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
