"""Benchmark of ``perfdb grid``: time to generate and write 100,000 rows (target: under 10 s).

It starts from a copy of a real profiled MatMulV2 CSV (the rows of the fixture
``kernel_details_level2_llm_train.csv``), routes MatMulV2 to the GEMM generator with a dense
generic (N, K) grid so that well over ``--rows`` candidates exist, and times the whole run:
config loading, expansion, budget filter, signatures and de-duplication against the existing
rows, sampling and the atomic CSV write under the lock.  A second figure times the shipped
config over every known model and kernel type with no row limit.

Prerequisites: any CPU, this project installed (``pip install -e .``), run from a checkout of
the repository (it reads the fixture under ``tests/fixtures``).

    python benchmarks/bench_grid.py [--rows 100000] [--repeat 3]

Expected output: a line with the rows written and the best and median time of ``--repeat``
runs, a line for the shipped config over all models, then ``grid: PASS`` (exit status 0) or
``grid: FAIL`` (exit status 1) when fewer rows were written or the best run took 10 s or more.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from perf_plugin.database.schema import IDENTITY_COLUMNS
from perf_plugin.grid.config import load_config
from perf_plugin.grid.memory import budget_bytes
from perf_plugin.grid.models import MODELS
from perf_plugin.grid.runner import GridRequest, run_grid

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "ascend" / "kernel_details_level2_llm_train.csv"
TARGET_S = 10.0

BENCH_CONFIG = """
grids:
  m: [{m}]
  n: [{nk}]
  k: [{nk}]
kernels:
  MatMulV2:
    generator: gemm
    options: {{kind: linear, generic_n: n, generic_k: k}}
    patterns:
      - name: linear
        over: {{m: m}}
        inputs: [[m, k], [n, k]]
        outputs: [[m, n]]
"""


def seed_matmul_csv(directory: Path) -> int:
    """Write MatMulV2.csv with the identity cells of the fixture's MatMulV2 rows."""
    with FIXTURE.open(newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["Type"] == "MatMulV2"]
    with (directory / "MatMulV2.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(list(IDENTITY_COLUMNS) + ["Profiling Average Duration(us)"])
        for row in rows:
            writer.writerow([row[c] for c in IDENTITY_COLUMNS] + [row["Duration(us)"]])
    return len(rows)


def time_run(work: Path, config_path: Path | None, rows: int, kernel_types: tuple[str, ...]) -> tuple[float, int]:
    database = work / "db"
    if database.exists():
        shutil.rmtree(database)
    database.mkdir()
    seed_matmul_csv(database)
    start = time.perf_counter()
    config = load_config(config_path)
    request = GridRequest(
        directory=database,
        config=config,
        models=MODELS,
        restricted=False,
        rows=rows,
        seed=0,
        budget=budget_bytes(32),
        kernel_types=kernel_types,
    )
    reports = run_grid(request)
    elapsed = time.perf_counter() - start
    return elapsed, sum(r.written for r in reports)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # 40 x 40 (N, K) pairs x 80 token counts = 128,000 generic candidates (+ model pairs)
        values = [128 * i for i in range(1, 41)]
        config_path = work / "bench_grid.yaml"
        config_path.write_text(
            BENCH_CONFIG.format(m=", ".join(str(m) for m in range(1, 81)), nk=", ".join(map(str, values))),
            encoding="utf-8",
        )
        times = []
        written = 0
        for _ in range(args.repeat):
            elapsed, written = time_run(work, config_path, args.rows, ("MatMulV2",))
            times.append(elapsed)
        best, median = min(times), statistics.median(times)
        print(f"grid: {written} MatMulV2 rows generated and written in {best:.2f} s best, "
              f"{median:.2f} s median of {args.repeat} ({written / best:,.0f} rows/s); target < {TARGET_S:.0f} s")

        kernel_types = tuple(load_config().kernels)
        elapsed, total = time_run(work, None, 0, kernel_types)
        print(f"grid: shipped config, all {len(MODELS)} models, {len(kernel_types)} kernel types, no row limit: "
              f"{total} rows in {elapsed:.2f} s")
    ok = written >= args.rows and best < TARGET_S
    print("grid: PASS" if ok else "grid: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
