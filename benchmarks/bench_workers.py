"""Wall time of one database replayed by 1 and by N pytest-xdist workers, one device each.

``pytest bench -n N`` starts one worker per device (``CUDA_VISIBLE_DEVICES`` pinned before the
worker's runtime starts) and the controller writes the database once at the end.  This times the
whole command, start-up and write-back included, for each worker count on the same copy of the
database, alternating the counts round by round (on a shared host one run of each is not enough
to tell a few percent from noise), and prints the medians, each count's speed-up over one worker
and the cases per second.  Every run must replay and pass the same number of cases.

The database is either a copy of a directory you name (``--database``) or one written here:
``--rows`` small Add rows of distinct shapes (host-bound cases of a few microseconds of device
time, the worst case for scaling: the per-case host work is all that is spread), or, with
``--grid MODELS``, the shipped sample widened by ``perfdb grid`` to the shapes those models run
(device-bound GEMMs, norms, attention).

Every pytest process imports torch: on an image that ships without ``.pyc`` files each one
recompiles it (~9 s a process, seen on H200 hosts), which this figure would count as start-up;
run ``python -m compileall -q -j 0 <torch's directory>`` once first, as a normal installation has
them (``reproduce/wip/cuda_evidence.sh`` does).

Prerequisites: as many devices as the largest worker count (an NVIDIA host with torch built for
CUDA, ``--backend cuda``; or the CPU, where workers share the cores and the figure says nothing
about devices); this project installed (``pip install -e .``), run from a checkout of the
repository (it runs ``bench/test_kernels.py``).

    python benchmarks/bench_workers.py --backend cuda --workers 1,2 --rows 6000 --rounds 2
    python benchmarks/bench_workers.py --backend cuda --workers 1,2 --grid llama-3.1-8b --grid-rows 100

Expected output: one line per run (workers, wall seconds, cases passed), then a table of the
medians: workers, wall time, speed-up over one worker, cases per second.  Exit status 1 when the
runs of different worker counts did not pass the same number of cases.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "database" / "data" / "CPU_X86_64" / "torch" / "torch2.13.0"
HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"
PASSED = re.compile(r"(\d+) passed")


def write_small_rows(directory: Path, rows: int) -> None:
    """``rows`` Add rows of distinct small 2-D shapes (at most ~60k elements each)."""
    lines = []
    for k in range(rows):
        shape = f"{1 + k % 97},{128 + 16 * (k // 97)}"
        lines.append(f'dynamic,AI_VECTOR_CORE,"""{shape};{shape}""",FLOAT;FLOAT,ND;ND,"""{shape}""",FLOAT,ND')
    (directory / "Add.csv").write_text("\n".join([HEADER, *lines]) + "\n")


def build_database(args: argparse.Namespace, directory: Path) -> None:
    if args.database:
        shutil.copytree(args.database, directory)
        return
    if args.grid:
        shutil.copytree(SAMPLE, directory)
        subprocess.run([sys.executable, "-m", "perf_plugin.cli", "grid", "--data-dir", str(directory),
                        "--target-models", args.grid, "--rows", str(args.grid_rows), "--seed", "0"],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        return
    directory.mkdir(parents=True)
    write_small_rows(directory, args.rows)


def run_once(database: Path, backend: str, workers: int, repeats: int, log: Path) -> tuple[float, int]:
    """Wall seconds of one whole ``pytest bench`` and the cases it passed."""
    command = [sys.executable, "-m", "pytest", "bench", "--perf-database-path", str(database),
               "--perf-backend", backend, "--perf-repeat-count", str(repeats), "--perf-no-writeback",
               "--perf-progress-interval", "0", "-q", "-p", "no:cacheprovider", "-n", str(workers)]
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    log.write_text(completed.stdout + completed.stderr)
    tail = completed.stdout.strip().splitlines()[-1:] or [""]
    found = PASSED.search(tail[0])
    return wall, int(found.group(1)) if found else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts (-n) to compare")
    parser.add_argument("--rows", type=int, default=6000, help="small Add rows to write (no --database/--grid)")
    parser.add_argument("--database", type=Path, help="replay a copy of this database directory instead")
    parser.add_argument("--grid", help="widen the shipped sample with perfdb grid for these models instead")
    parser.add_argument("--grid-rows", type=int, default=100, help="at most this many grid rows per kernel CSV")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="keep the database copy and the logs here")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_workers_"))
    out.mkdir(parents=True, exist_ok=True)
    database = out / "db"
    if database.exists():
        shutil.rmtree(database)
    build_database(args, database)
    walls: dict[int, list[float]] = {n: [] for n in counts}
    passed: dict[int, set[int]] = {n: set() for n in counts}
    for round_number in range(args.rounds):
        order = counts if round_number % 2 == 0 else list(reversed(counts))
        for workers in order:
            wall, cases = run_once(database, args.backend, workers, args.repeats, out / f"n{workers}_r{round_number}.log")
            walls[workers].append(wall)
            passed[workers].add(cases)
            print(f"round {round_number + 1}: -n {workers}: {wall:.1f} s, {cases} passed", flush=True)
    base = median(walls[counts[0]])
    print(f"\nworkers  wall (median of {args.rounds})  speed-up over -n {counts[0]}  cases/s")
    for workers in counts:
        wall = median(walls[workers])
        cases = max(passed[workers])
        print(f"{workers:>7}  {wall:>10.1f} s{'':12}{base / wall:>6.2f}x{'':18}{cases / wall:>7.0f}")
    print(f"logs and database: {out}")
    same = len({frozenset(p) for p in passed.values()}) == 1 and all(len(p) == 1 for p in passed.values())
    if not same:
        print("the worker counts did not pass the same number of cases:", {n: sorted(p) for n, p in passed.items()})
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
