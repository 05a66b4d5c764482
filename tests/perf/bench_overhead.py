"""Per-case overhead of the harness: N small-kernel rows through pytest vs a bare Python loop.

Both sides do the same replays (build inputs, verify once, warm up, timed repeats under the same
in-process profiler collector); the pytest side adds collection, fixtures, reports, result
transport and write-back.  Each side runs in its own fresh process and is timed inside it, from
just before the work starts (torch already imported) to just after it ends.  Also prints the
peak RSS and peak device memory of the pytest process, so runs with different N show whether
memory stays flat.

    python tests/perf/bench_overhead.py --backend cpu --cases 1000 --repeats 30
    python tests/perf/bench_overhead.py --backend cuda --cases 3000 --repeats 30
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"

CHILD_PYTEST = textwrap.dedent(
    """
    import json, resource, sys, time
    import pytest, torch
    db, backend, repeats, out, cache_mode = sys.argv[1:6]
    start = time.perf_counter()
    code = pytest.main([{bench!r}, "--database-path", db, "--backend", backend, "--repeat-count", repeats,
                        "--cache-mode", cache_mode,
                        "-q", "-p", "no:cacheprovider", "--no-header", "-o", "console_output_style=classic"])
    wall = time.perf_counter() - start
    peak_device = torch.cuda.max_memory_allocated() if backend == "cuda" else 0
    json.dump({{"wall": wall, "code": int(code), "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               "device": peak_device}}, open(out, "w"))
    """
)

CHILD_BARE = textwrap.dedent(
    """
    import json, resource, sys, time
    import torch
    from pathlib import Path
    from perf_plugin.backends.select import resolve_backend
    from perf_plugin.cases import load_case_set
    from perf_plugin.profiling.torch_profiler import TorchProfilerCollector
    from perf_plugin.replay.cache_modes import effective_cache_mode
    from perf_plugin.replay.registry import get_replay
    from perf_plugin.replay.runner import ReplayRunner
    db, backend_name, repeats, out, cache_mode = sys.argv[1:6]
    start = time.perf_counter()
    backend = resolve_backend(backend_name)
    collector = TorchProfilerCollector(backend, batch_size=32)
    runner = ReplayRunner(backend, collector, int(repeats), 5, cache_mode=effective_cache_mode(cache_mode, backend.name))
    results = []
    for case in load_case_set(Path(db), get_replay).cases:
        runner.run(case)
        results.extend(collector.drain())
    results.extend(collector.finish())
    wall = time.perf_counter() - start
    ok = sum(1 for r in results if r.samples_us)
    json.dump({"wall": wall, "ok": ok, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}, open(out, "w"))
    """
)


def small_shape(k: int) -> tuple[int, int]:
    """Distinct 2-D shapes of at most ~60k elements: kernels of a few microseconds on a GPU."""
    return 1 + k % 97, 128 + 16 * (k // 97)


def write_database(directory: Path, cases: int) -> None:
    rows = []
    for k in range(cases):
        rows_, cols = small_shape(k)
        shape = f"{rows_},{cols}"
        rows.append(f'dynamic,AI_VECTOR_CORE,"""{shape};{shape}""",FLOAT;FLOAT,ND;ND,"""{shape}""",FLOAT,ND')
    (directory / "Add.csv").write_text("\n".join([HEADER, *rows]) + "\n")


def run_child(source: str, db: Path, backend: str, repeats: int, scratch: Path, cache_mode: str = "auto") -> dict:
    out = scratch / "out.json"
    script = scratch / "child.py"
    script.write_text(source)
    subprocess.run([sys.executable, str(script), str(db), backend, str(repeats), str(out), cache_mode], check=True,
                   cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--cache-mode", default="auto", help="--cache-mode of both sides (default: the harness default)")
    parser.add_argument("--memory-only", action="store_true", help="only the pytest run: wall time, peak RSS and device memory")
    args = parser.parse_args()
    if args.memory_only:
        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp)
            db = scratch / "db"
            db.mkdir()
            write_database(db, args.cases)
            harness = run_child(CHILD_PYTEST.format(bench=str(ROOT / "bench" / "test_kernels.py")), db, args.backend,
                                args.repeats, scratch, args.cache_mode)
        print(f"backend={args.backend} cases={args.cases} repeats={args.repeats} pytest wall {harness['wall']:.1f} s "
              f"({args.cases / harness['wall']:.0f} cases/s), exit code {harness['code']}")
        print(f"peak RSS {harness['rss'] / 2**20:.0f} MiB, peak device memory {harness['device'] / 2**20:.1f} MiB")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        db = scratch / "db"
        db.mkdir()
        write_database(db, args.cases)
        bare = run_child(CHILD_BARE, db, args.backend, args.repeats, scratch, args.cache_mode)
        pytest_child = CHILD_PYTEST.format(bench=str(ROOT / "bench" / "test_kernels.py"))
        harness = run_child(pytest_child, db, args.backend, args.repeats, scratch, args.cache_mode)
        # the same at half the rows: the difference removes fixed costs (start-up, collection,
        # reports), leaving the marginal per-case cost of each side
        half_db = scratch / "half"
        half_db.mkdir()
        write_database(half_db, args.cases // 2)
        bare_half = run_child(CHILD_BARE, half_db, args.backend, args.repeats, scratch, args.cache_mode)
        harness_half = run_child(pytest_child, half_db, args.backend, args.repeats, scratch, args.cache_mode)
    ratio = harness["wall"] / bare["wall"]
    print(f"backend={args.backend} cases={args.cases} repeats={args.repeats} cache mode={args.cache_mode}")
    print(f"{'':10}{'wall s':>10}{'cases/s':>10}{'peak RSS MiB':>14}")
    print(f"{'bare loop':10}{bare['wall']:>10.2f}{args.cases / bare['wall']:>10.0f}{bare['rss'] / 2**20:>14.0f}")
    print(f"{'pytest':10}{harness['wall']:>10.2f}{args.cases / harness['wall']:>10.0f}{harness['rss'] / 2**20:>14.0f}")
    print(f"ratio pytest/bare = {ratio:.3f}  (target <= 1.2)   bare loop measured {bare['ok']} cases")
    extra = args.cases - args.cases // 2
    per_bare = (bare["wall"] - bare_half["wall"]) / extra
    per_harness = (harness["wall"] - harness_half["wall"]) / extra
    print(
        f"marginal per case: bare {1e3 * per_bare:.3f} ms, pytest {1e3 * per_harness:.3f} ms, "
        f"ratio {per_harness / per_bare:.3f}  ({1 / per_harness:.0f} cases/s through pytest)"
    )
    print(f"peak RSS at {args.cases // 2} cases: pytest {harness_half['rss'] / 2**20:.0f} MiB (flat memory: close to the above)")
    if args.backend == "cuda":
        print(f"peak device memory (pytest process) = {harness['device'] / 2**20:.1f} MiB")
    print(f"pytest exit code {harness['code']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
