"""Soak test of what the README promises, on the CPU: runs that end, interrupts that keep measurements.

Three scenarios, each run many times from a checkout of the repository:

* ``comm``: the two collective forms the README gives, gloo with 2 ranks, over the shipped
  ``bench/`` (replay cases and collectives in one directory):
  ``pytest bench -m comm --comm-nproc 2`` and ``torchrun --nproc-per-node 2 -m pytest bench -m hccl``
  (torchrun's default port, as a user types it).  A run that has not ended after ``--hang-s``
  seconds is a hang; it is killed with its whole process group.
* ``interrupt``: ``pytest bench -n 2`` on a fresh copy of the shipped database, interrupted at a
  random moment by SIGINT to its process group (a terminal's Ctrl-C) or by SIGTERM to pytest
  alone (a scheduler's stop).  After it ends, the rows whose cells changed in the CSVs are
  counted and compared with what pytest's last line says: every case that passed and every case
  the run says it measured must be written (``lost`` counts the difference).
* ``main``: the README's main command, ``pytest bench``, in a copy of the project.

Every child starts in a process group of its own with SIGINT at its default, so the script
behaves the same when it is itself started in the background (where a shell ignores SIGINT).

    python benchmarks/soak_promises.py                       # 20 + 20 collective runs, 20 interrupts, 5 main runs
    python benchmarks/soak_promises.py --comm-runs 3 --interrupt-runs 4 --main-runs 1

Expected output: one line per run (scenario, form, exit code, seconds, counts), then one summary
line per scenario: runs, hangs, exit codes, and for interrupts the cases passed, measured and
written and how many were lost.  Exit status 1 when any run hung, failed, or lost a measured case.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "database" / "data" / "CPU_X86_64" / "torch" / "torch2.13.0"
DURATION = "MicroBench Median Duration(us)"  # written by every measurement, in no shipped row before
COMM_GRID = ["--bytes-grid", "1K,64K", "--comm-iters", "5", "--comm-warmup", "1"]


@dataclass
class Run:
    scenario: str
    form: str
    code: int | None  # None: hung (killed)
    seconds: float
    output: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def hung(self) -> bool:
        return self.code is None


def _default_sigint() -> None:
    # a background shell starts children with SIGINT ignored; a Python started so never turns
    # Ctrl-C into KeyboardInterrupt, and the interrupt scenario would measure nothing
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(command: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)


def finish(process: subprocess.Popen[str], deadline_s: float) -> tuple[int | None, str]:
    try:
        output = process.communicate(timeout=deadline_s)[0]
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the ranks too: they are in its group
        return None, process.communicate()[0]


def last_line_counts(output: str) -> dict[str, int]:
    """"78 passed, 64 written, ..." of pytest's last line, as {"passed": 78, "written": 64}."""
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error|measured|deselected)", line)]
    if not lines:
        return {}
    return {name.strip(): int(number) for number, name in re.findall(r"(\d+) ([a-z][a-z -]*?)(?=,| in |\s*=|$)", lines[-1])}


def changed_rows(before: Path, after: Path) -> int:
    """Rows whose measured duration a run wrote (write-back may add columns: compare by name)."""
    changed = 0
    for path in sorted(before.glob("*.csv")):
        with open(path, newline="", encoding="utf-8") as a, open(after / path.name, newline="", encoding="utf-8") as b:
            old_rows, new_rows = list(csv.DictReader(a)), list(csv.DictReader(b))
        changed += sum(
            1 for old, new in zip(old_rows, new_rows)
            if new.get(DURATION) and new.get(DURATION) != old.get(DURATION)
        )
    return changed


def torchrun() -> list[str]:
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def comm_run(form: str, out: Path, hang_s: float) -> Run:
    output_dir = out / f"comm-{form}"
    shutil.rmtree(output_dir, ignore_errors=True)
    common = ["-m", "comm" if form == "comm-nproc" else "hccl", "--comm-output-dir", str(output_dir), *COMM_GRID,
              "-p", "no:cacheprovider", "-q"]
    if form == "comm-nproc":
        command = [sys.executable, "-m", "pytest", "bench", *common, "--comm-nproc", "2"]
    else:
        command = [*torchrun(), "--nproc-per-node", "2", "-m", "pytest", "bench", *common]
    began = time.monotonic()
    code, output = finish(start(command, REPO), hang_s)
    run = Run("comm", form, code, time.monotonic() - began, output, last_line_counts(output))
    run.counts["csvs"] = len(list(output_dir.glob("hcom_*.csv")))
    return run


def interrupt_run(how: str, after_s: float, out: Path, hang_s: float) -> Run:
    database = out / "interrupt-db"
    shutil.rmtree(database, ignore_errors=True)
    shutil.copytree(SAMPLE, database)
    command = [sys.executable, "-m", "pytest", "bench", "-n", "2", "--perf-database-path", str(database),
               "-p", "no:cacheprovider", "-q", "--perf-progress-interval", "0"]
    began = time.monotonic()
    process = start(command, REPO)
    try:
        process.wait(timeout=after_s)  # ended first: not interrupted
    except subprocess.TimeoutExpired:
        if how == "SIGINT":
            os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        else:
            process.send_signal(signal.SIGTERM)  # what a scheduler's stop does
    code, output = finish(process, hang_s)
    run = Run("interrupt", f"{how}@{after_s:.0f}s", code, time.monotonic() - began, output, last_line_counts(output))
    written = changed_rows(SAMPLE, database)
    journal = database / ".perf-journal"
    left = sorted(p.name for p in journal.glob("*.jsonl")) if journal.is_dir() else []
    run.counts["rows written"] = written
    run.counts["journals left"] = len(left)
    return run


def main_run(out: Path, hang_s: float) -> Run:
    project = out / "project"
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir(parents=True)
    for name in ("bench", "database", "conftest.py", "pyproject.toml"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, project / name, ignore=shutil.ignore_patterns("reports", ".perf-journal", "__pycache__"))
        elif source.exists():
            shutil.copy(source, project / name)
    began = time.monotonic()
    code, output = finish(start([sys.executable, "-m", "pytest", "bench"], project), hang_s)
    return Run("main", "pytest bench", code, time.monotonic() - began, output, last_line_counts(output))


def lost(run: Run) -> int:
    """Cases the run passed or says it measured that are not in the CSVs."""
    if run.scenario != "interrupt" or run.hung:
        return 0
    claimed = max(run.counts.get("passed", 0), run.counts.get("measured", 0))
    return max(claimed - run.counts.get("rows written", 0), 0)


def failed(run: Run) -> bool:
    if run.hung:
        return True
    if run.scenario == "interrupt":  # 2: interrupted; a journal left holds results this run did not write
        # a SIGTERM in the first seconds, before the run has a journal to keep, ends pytest as it ends
        # any process (exit -15): nothing had been measured, so nothing was lost
        before_the_run = run.code == -signal.SIGTERM and not run.counts.get("rows written")
        return (run.code not in (0, 2) and not before_the_run) or lost(run) > 0 or run.counts.get("journals left", 0) > 0
    if run.scenario == "comm":
        return run.code != 0 or run.counts.get("csvs", 0) != 4
    return run.code != 0


def describe(run: Run) -> str:
    counts = ", ".join(f"{v} {k}" for k, v in run.counts.items())
    code = "HUNG" if run.hung else str(run.code)
    flag = "  <-- FAILED" if failed(run) else ""
    return f"{run.scenario:9} {run.form:24} exit {code:>4} {run.seconds:7.1f} s  {counts}{flag}"


def summarize(runs: list[Run]) -> list[str]:
    lines = []
    for scenario in ("comm", "interrupt", "main"):
        mine = [r for r in runs if r.scenario == scenario]
        if not mine:
            continue
        codes = Counter("hung" if r.hung else str(r.code) for r in mine)
        line = (f"{scenario}: {len(mine)} runs, {sum(r.hung for r in mine)} hangs, {sum(failed(r) for r in mine)} failed, "
                f"exit codes {dict(codes)}, slowest {max(r.seconds for r in mine):.1f} s")
        if scenario == "interrupt":
            passed = sum(r.counts.get("passed", 0) for r in mine)
            measured = sum(r.counts.get("measured", r.counts.get("passed", 0)) for r in mine)
            written = sum(r.counts.get("rows written", 0) for r in mine)
            line += f"; cases passed {passed}, measured {measured}, rows written {written}, lost {sum(lost(r) for r in mine)}"
        lines.append(line)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comm-runs", type=int, default=20, help="runs of each collective form")
    parser.add_argument("--interrupt-runs", type=int, default=20, help="interrupted -n 2 runs (SIGINT and SIGTERM alternate)")
    parser.add_argument("--main-runs", type=int, default=5, help="runs of the README's main command")
    parser.add_argument("--interrupt-window", default="3,45", help="seconds after the start to interrupt in, low,high")
    parser.add_argument("--hang-s", type=float, default=300.0, help="a run still going after this long is a hang")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the working directory and print it")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    low, high = (float(x) for x in args.interrupt_window.split(","))
    out = Path(tempfile.mkdtemp(prefix="soak-"))
    runs: list[Run] = []

    def record(run: Run) -> None:
        runs.append(run)
        print(describe(run), flush=True)
        if failed(run):
            print("\n".join(run.output.splitlines()[-40:]), flush=True)

    for _ in range(args.comm_runs):
        for form in ("comm-nproc", "torchrun"):
            record(comm_run(form, out, args.hang_s))
    for index in range(args.interrupt_runs):
        record(interrupt_run("SIGINT" if index % 2 == 0 else "SIGTERM", rng.uniform(low, high), out, args.hang_s))
    for _ in range(args.main_runs):
        record(main_run(out, args.hang_s))
    print()
    print("\n".join(summarize(runs)))
    if args.keep:
        print(f"working directory: {out}")
    else:
        shutil.rmtree(out, ignore_errors=True)
    return 1 if any(failed(r) for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
