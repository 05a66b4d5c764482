"""``pytest bench`` on the shipped sample database, on the CPU: rows replayed and wall time.

Reproduces docs/measured.md, "Measured", on the 2-core x86 CPU machine: "``pytest bench`` on the
shipped sample: 100 passed in 44-85 s depending on the day's machine (large real GEMM shapes on
two cores: the three slowest cases, 4096x6144x1024 bf16 GEMMs at ~0.15 s per call, take 6-7 s
each)".

Steps: copy the shipped sample's CSVs (``database/data/CPU_X86_64/torch/torch2.13.0``, reports
left out) into ``OUT/db`` so that the shipped files are not written back, replay them with
``pytest bench --perf-database-path OUT/db --perf-backend cpu`` and the default settings (30
timed repeats, 5 warm-ups), and read the outcome from the run's JSON report and each case's
time from a JUnit XML file.

Prerequisites: an x86-64 CPU (the figure is for 2 cores), Python 3.11+, torch (2.13 CPU build
verified), this project installed (``pip install -e .``); run from a checkout of the
repository (it needs ``bench/`` and ``database/``).

    python reproduce/sample_replay_cpu.py [--out DIR]

Expected output (about a minute on 2 idle cores): the tail of pytest's output (``100 passed``),
then, from a run of this version on a 2-core x86 machine,

    sample: 100 of 100 rows replayed and passed in 65.3 s (pytest session), 67.1 s wall
    slowest cases: 6.1 s MatMulV3-4096x1024,6144x1024-BF16-to-4096x6144-BF16, 5.6 s ..., 5.4 s ...
    README: 100 passed in 44-85 s -> match

and ``OUT/sample_replay_cpu.json`` (fields of the reproduction-run convention; ``stats`` holds
the figures).  ``OUT`` (by default a new temporary directory, kept) also holds the replayed
copy with its reports and pytest's output ``OUT/pytest.log``.  Exit status 1 when not every row
passed or the session took longer than README's range.  The time is the machine's: with other
processes busy on the same two cores the same run took 143-166 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

from perf_plugin.report.environment import collect_env_spec
from perf_plugin.report.run_json import LLM_CONCURRENCY, finite_values, report_json

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "database" / "data" / "CPU_X86_64" / "torch" / "torch2.13.0"
NAME = "sample_replay_cpu"
README_ROWS = 100
README_SECONDS = (44.0, 85.0)


def case_times(junit: Path) -> list[tuple[float, str]]:
    """(seconds, test id) of every case in the JUnit XML file, slowest first."""
    if not junit.exists():
        return []
    found = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        found.append((float(case.get("time", "0") or 0.0), name.removeprefix("test_kernel_replay[").removesuffix("]")))
    return sorted(found, reverse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="output directory (default: a new temporary directory, kept)")
    parser.add_argument("--sample", type=Path, default=SAMPLE, help="database directory to copy (default: %(default)s)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    out = args.out or Path(tempfile.mkdtemp(prefix=f"{NAME}_"))
    out.mkdir(parents=True, exist_ok=True)
    database = out / "db"
    if database.exists():
        raise SystemExit(f"{database} exists: give an empty --out")
    database.mkdir()
    for path in sorted(args.sample.glob("*.csv")):
        shutil.copy2(path, database / path.name)
    junit = out / "junit.xml"
    command = [sys.executable, "-m", "pytest", "bench", "--perf-database-path", str(database), "--perf-backend", "cpu",
               "-q", "-p", "no:cacheprovider", "--junitxml", str(junit)]
    print("$", " ".join(command[2:]), flush=True)
    replay_started = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - replay_started
    (out / "pytest.log").write_text(completed.stdout + completed.stderr, encoding="utf-8")
    print("\n".join([line for line in completed.stdout.splitlines() if line.strip()][-6:]))
    reports = sorted((database / "reports").glob("run_report_*.json"))
    if not reports:
        raise SystemExit(f"no run report under {database / 'reports'}: the replay did not finish")
    report: dict[str, Any] = json.loads(reports[-1].read_text(encoding="utf-8"))

    rows, passed = report["ops_count"], report["outcome_counts"]["passed"]
    session_s = report["elapsed_s"]
    slowest = case_times(junit)[:3]
    print(f"sample: {passed} of {rows} rows replayed and passed in {session_s:.1f} s (pytest session), {wall:.1f} s wall")
    print("slowest cases: " + ", ".join(f"{seconds:.1f} s {name}" for seconds, name in slowest))
    match = passed == rows == README_ROWS and session_s <= README_SECONDS[1]
    print(f"README: {README_ROWS} passed in {README_SECONDS[0]:g}-{README_SECONDS[1]:g} s -> "
          f"{'match' if match else 'DIFFERENT'}")

    stats = dict(report["stats"])
    stats.update({
        "rows": rows,
        "rows_passed": passed,
        "session_s": session_s,
        "wall_s": wall,
        "slowest_cases": [{"case": name, "seconds": seconds} for seconds, name in slowest],
        "outcome_counts": report["outcome_counts"],
        "pytest_exit_code": completed.returncode,
        "readme": {"rows_passed": README_ROWS, "session_s": list(README_SECONDS)},
        "matches_readme": match,
    })
    result = {
        "benchmark": f"perf_plugin.reproduce:{NAME}",
        "script": f"reproduce/{NAME}.py",
        "workflow": "pytest bench",
        "pass_n": report["pass_n"],
        "ops_count": rows,
        "elapsed_s": time.perf_counter() - started,
        "device_ids": report["device_ids"],
        "max_concurrency": report["max_concurrency"],
        "llm_concurrency": LLM_CONCURRENCY,
        "env_spec": collect_env_spec("cpu", cwd=ROOT),
        "task_log_dir": str(out),
        "stats": stats,
        "replay_run": report["replay_run"],
    }
    path = out / f"{NAME}.json"
    path.write_text(report_json(finite_values(result), indent=2) + "\n", encoding="utf-8")
    print(f"report: {path}")
    return 0 if completed.returncode == 0 and match else 1


if __name__ == "__main__":
    sys.exit(main())
