"""Coverage of the real Ascend profiles, ingested and replayed on the CPU.

Reproduces docs/coverage.md, "Coverage of real profiles": ``--level level2`` (default) ingests
``tests/fixtures/ascend/kernel_details_level2_llm_train.csv`` (a real CANN 8.3 Level2 profile of an
LLM training step: 109 rows), of which 108 replay and pass (99.1 % of the rows), 99.2 % of the
profile's compute time; ``--level level1`` ingests ``kernel_details_level1.csv`` (a CNN trained on
an NPU, batch 32: 134 rows in 33 kernel types, convolutions on 5HD and FRACTAL_Z layouts,
TransData, the optimizer's Foreach kernels, max pooling with its UINT16 mask), of which 133
replay and pass (99.3 %), 98.2 % of its time.  The row left in both is a MemSet (a memory
initialisation the profile records with no shapes of its own).

Steps: ingest the profile into a fresh database (``perfdb ingest --profiling-path FILE
--database-path OUT/db``), replay it with ``pytest bench --perf-database-path OUT/db
--perf-repeat-count 3 --perf-warmup-count 1`` (as ``tests/test_level2_end_to_end.py`` and
``tests/test_level1_end_to_end.py`` do), then read the row and time-weighted coverage from the
run's JSON report.

Prerequisites: a CPU (no accelerator; verified on a 2-core x86-64 machine), Python 3.11+, torch
(2.13 CPU build verified), this project installed (``pip install -e .``); the script is run from
a checkout of the repository (it needs ``bench/`` and the fixtures).

    python reproduce/ascend_coverage_cpu.py [--level level1|level2] [--out DIR]

Expected output (about 3 minutes per profile on a 2-core x86 machine): perfdb's ingest summary,
the tail of pytest's output (``108 passed, 1 skipped`` / ``133 passed, 1 skipped``, the MemSet row
named with its reason), then

    rows: 108 of 109 replayed and passed (99.1 %), 99.2 % of the profiled compute time
    not replayed: OUT/db/MemSet.csv, row 2: replay cannot be built: MemSet records no tensors
    README: 108 of 109 rows, 99.2 % of the time -> match

and ``OUT/ascend_coverage_cpu.json`` (fields of the reproduction-run convention; ``stats`` holds
the figures).  ``OUT`` (by default a new temporary directory, kept) also holds the replayed
database ``OUT/db`` with its reports and pytest's output ``OUT/pytest.log``.  Exit status 1
when the figures differ from the documented ones.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perf_plugin.cli import main as perfdb
from perf_plugin.report.environment import collect_env_spec
from perf_plugin.report.run_json import LLM_CONCURRENCY, finite_values, report_json

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "ascend"
NAME = "ascend_coverage_cpu"
# level -> (profile, (rows passed, rows selected), share of the profiled time in %), as documented
PROFILES: dict[str, tuple[Path, tuple[int, int], float]] = {
    "level2": (FIXTURES / "kernel_details_level2_llm_train.csv", (108, 109), 99.2),
    "level1": (FIXTURES / "kernel_details_level1.csv", (133, 134), 98.2),
}


def replay(database: Path, repeats: int, warmups: int, log: Path) -> int:
    command = [sys.executable, "-m", "pytest", "bench", "--perf-database-path", str(database),
               "--perf-backend", "cpu", "--perf-repeat-count", str(repeats), "--perf-warmup-count", str(warmups),
               "-q", "-rs", "-p", "no:cacheprovider"]
    print("$", " ".join(command[2:]), flush=True)
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    log.write_text(completed.stdout + completed.stderr, encoding="utf-8")
    tail = [line for line in completed.stdout.splitlines() if line.strip()][-8:]
    print("\n".join(tail))
    return completed.returncode


def run_report(database: Path) -> dict[str, Any]:
    reports = sorted((database / "reports").glob("run_report_*.json"))
    if not reports:
        raise SystemExit(f"no run report under {database / 'reports'}: the replay did not finish")
    return json.loads(reports[-1].read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="output directory (default: a new temporary directory, kept)")
    parser.add_argument("--level", choices=sorted(PROFILES), default="level2", help="which real profile (default: level2)")
    parser.add_argument("--repeats", type=int, default=3, help="--perf-repeat-count (default 3)")
    parser.add_argument("--warmups", type=int, default=1, help="--perf-warmup-count (default 1)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    out = args.out or Path(tempfile.mkdtemp(prefix=f"{NAME}_"))
    out.mkdir(parents=True, exist_ok=True)
    database = out / "db"
    if database.exists():
        raise SystemExit(f"{database} exists: give an empty --out")
    profile, README_ROWS, README_TIME_PERCENT = PROFILES[args.level]  # noqa: N806 (the documented figures)
    if perfdb(["ingest", "--profiling-path", str(profile), "--database-path", str(database)]) != 0:
        return 1
    code = replay(database, args.repeats, args.warmups, out / "pytest.log")
    report = run_report(database)
    run = report["replay_run"]
    outcomes = report["outcome_counts"]
    selected, passed = report["ops_count"], outcomes["passed"]
    left = [r["reason"] or f"{r['csv_file']} row {r['row_line']}: {r['outcome']}"
            for r in report["results"] if r["outcome"] != "passed"]
    rows_share, time_share = run["coverage"], run["coverage_time"]
    print(f"rows: {passed} of {selected} replayed and passed ({100 * rows_share:.1f} %), "
          f"{100 * time_share:.1f} % of the profiled compute time")
    for line in left:
        print(f"not replayed: {line.split(' (')[0]}")  # the full reason is in the JSON report
    match = (passed, selected) == README_ROWS and round(100 * time_share, 1) == README_TIME_PERCENT
    print(f"README: {README_ROWS[0]} of {README_ROWS[1]} rows, {README_TIME_PERCENT} % of the time -> "
          f"{'match' if match else 'DIFFERENT'}")

    stats = dict(report["stats"])
    stats.update({
        "rows": selected,
        "rows_passed": passed,
        "coverage_rows": rows_share,
        "coverage_time": time_share,
        "not_replayed": left,
        "outcome_counts": outcomes,
        "pytest_exit_code": code,
        "readme": {"rows_passed": README_ROWS[0], "rows": README_ROWS[1], "coverage_time_percent": README_TIME_PERCENT},
        "matches_readme": match,
    })
    result = {
        "benchmark": f"perf_plugin.reproduce:{NAME}",
        "script": f"reproduce/{NAME}.py",
        "workflow": "perfdb ingest + pytest bench",
        "pass_n": report["pass_n"],
        "ops_count": selected,
        "elapsed_s": time.perf_counter() - started,
        "device_ids": report["device_ids"],
        "max_concurrency": report["max_concurrency"],
        "llm_concurrency": LLM_CONCURRENCY,
        "env_spec": collect_env_spec("cpu", cwd=ROOT),
        "task_log_dir": str(out),
        "stats": stats,
        "profile": str(profile),
        "replay_run": run,
    }
    path = out / f"{NAME}.json"
    path.write_text(report_json(finite_values(result), indent=2) + "\n", encoding="utf-8")
    print(f"report: {path}")
    return 0 if code == 0 and match else 1


if __name__ == "__main__":
    sys.exit(main())
