"""Which cache mode lands closest to the durations kernels had inside a real model run?

Reproduces docs/measured.md, "Measured" (H100), "Cache modes against in-model durations": a 4-layer
Llama-3.1-8B prefill of 512 tokens and decode of 16 tokens, bf16, profiled and ingested, then
replayed in each mode; microbench / in-model, geometric mean over rows and ratio of sums: decode
warm 0.79 / 0.86, rotate 0.96 / 0.96, cold 1.16 / 1.17; prefill warm 0.84 / 0.91, rotate 1.11 /
0.99, cold 1.33 / 1.12.

Input: a database directory ingested from a profile of a model run (``--database``: from
``perfdb ingest`` or ``examples/transformer_trace.py``), whose rows carry ``Profiling Average
Duration(us)``; or ``--tokens N``, which first runs ``examples/transformer_trace.py`` (4
Llama-3.1-8B decoder layers, bf16, 3 forward passes of N tokens) into ``OUT/trace``.  For each
cache mode the directory is copied and replayed by ``pytest bench --perf-cache-mode MODE``; each
row's microbenchmark average is set against its in-model average.

Prints, per mode: the geometric mean of microbench / in-model, the median and 90th percentile of
the absolute deviation, and the ratio of the summed durations (what a model of the whole run
would see); then the same per kernel type.  Writes every row's figures to ``--csv`` if given.

Verification missing: needs an NVIDIA GPU; not run on this version (README's figures were taken
on an H100 80GB HBM3 with an earlier version whose CUDA collector is this version's).

Prerequisites: an NVIDIA GPU, torch built for CUDA, this project installed (``pip install -e .``),
run from a checkout of the repository (``bench/``, ``examples/``).

    python reproduce/wip/cache_modes_vs_model.py --tokens 512 --backend cuda --out OUT_PREFILL
    python reproduce/wip/cache_modes_vs_model.py --tokens 16 --backend cuda --out OUT_DECODE
    python reproduce/wip/cache_modes_vs_model.py --database DIR --backend cuda [--modes warm,rotate:64] [--csv FILE]

Expected output: a table with one line per mode (rows, geometric mean, median and p90 of the
absolute deviation, sum ratio), then one line per kernel type (geometric mean and sum ratio per
mode); then ``OUT/cache_modes_vs_model.json`` (by default in a new temporary directory) with
the per-mode summary under ``stats.modes``.
"""

from __future__ import annotations

import argparse
import csv
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf_plugin.database.schema import MICROBENCH_AVERAGE, PROFILING_AVERAGE
from perf_plugin.replay.cache_modes import CACHE_MODES
from perf_plugin.report.environment import collect_env_spec
from perf_plugin.report.run_json import LLM_CONCURRENCY, finite_values, report_json

ROOT = Path(__file__).resolve().parents[2]
NAME = "cache_modes_vs_model"

IDENTITY = ("Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types", "Output Formats")


@dataclass(frozen=True)
class Pair:
    kernel_type: str
    identity: tuple[str, ...]
    in_model_us: float
    microbench_us: float

    @property
    def ratio(self) -> float:
        return self.microbench_us / self.in_model_us


def replay(database: Path, backend: str, variant: str, repeats: int, scratch: Path) -> Path:
    """``variant``: a cache mode, or ``rotate:N`` for rotate mode with at most N input copies."""
    mode, _, max_copies = variant.partition(":")
    copy = scratch / variant.replace(":", "_")
    shutil.copytree(database, copy, ignore=shutil.ignore_patterns("reports", "*.lock"))
    extra = ["--perf-rotate-max-copies", max_copies] if max_copies else []
    subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "bench" / "test_kernels.py"), "--perf-database-path", str(copy),
         "--perf-backend", backend, "--perf-cache-mode", mode, *extra, "--perf-repeat-count", str(repeats), "-q",
         "-p", "no:cacheprovider", "--no-header"],
        check=False, cwd=ROOT, stdout=subprocess.DEVNULL,
    )
    return copy


def pairs(directory: Path) -> list[Pair]:
    found = []
    for path in sorted(directory.glob("*.csv")):
        if path.stem.endswith(".quarantine"):
            continue
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                model, bench = row.get(PROFILING_AVERAGE, ""), row.get(MICROBENCH_AVERAGE, "")
                if model and bench and float(model) > 0 and float(bench) > 0:
                    found.append(Pair(path.stem, tuple(row.get(c, "") for c in IDENTITY), float(model), float(bench)))
    return found


def summary(selected: list[Pair]) -> tuple[float, float, float, float]:
    """(geometric mean ratio, median |deviation|, p90 |deviation|, summed-duration ratio)."""
    logs = [math.log(p.ratio) for p in selected]
    deviations = sorted(abs(p.ratio - 1.0) for p in selected)
    p90 = deviations[min(len(deviations) - 1, math.ceil(0.9 * len(deviations)) - 1)]
    total = sum(p.microbench_us for p in selected) / sum(p.in_model_us for p in selected)
    return math.exp(statistics.fmean(logs)), statistics.median(deviations), p90, total


def model_trace(tokens: int, backend: str, out: Path) -> Path:
    """Profile 4 Llama-3.1-8B decoder layers (3 forward passes of ``tokens`` tokens) and ingest the trace."""
    database = out / "trace"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "transformer_trace.py"), "--device", backend, "--dtype", "bf16",
         "--tokens", str(tokens), "--layers", "4", "--iterations", "3", "--out", str(database)],
        check=True, cwd=ROOT,
    )
    return database


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--database", type=Path, help="directory ingested from a model run")
    source.add_argument("--tokens", type=int, help="profile 4 Llama-3.1-8B layers on this many tokens first")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--modes", default=",".join(m for m in CACHE_MODES if m != "auto"),
                        help="comma-separated cache modes; rotate:N caps rotation at N input copies")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--csv", type=Path, help="write every row's figures here")
    parser.add_argument("--out", type=Path, help=f"directory of {NAME}.json and the trace (default: a new temporary directory)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    out = args.out or Path(tempfile.mkdtemp(prefix=f"{NAME}_"))
    out.mkdir(parents=True, exist_ok=True)
    if args.database is None:
        args.database = model_trace(args.tokens, args.backend, out)
    modes = [m for m in args.modes.split(",") if m]
    results: dict[str, list[Pair]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            results[mode] = pairs(replay(args.database, args.backend, mode, args.repeats, Path(tmp)))
    print(f"database {args.database}, backend {args.backend}; ratio = microbench / in-model average")
    print(f"{'mode':12}{'rows':>6}{'geomean':>10}{'median |dev|':>14}{'p90 |dev|':>11}{'sum ratio':>11}")
    for mode, found in results.items():
        if found:
            geo, median, p90, total = summary(found)
            print(f"{mode:12}{len(found):>6}{geo:>10.3f}{100 * median:>13.1f}%{100 * p90:>10.1f}%{total:>11.3f}")
    kernel_types = sorted({p.kernel_type for found in results.values() for p in found})
    print(f"\n{'kernel type':22}" + "".join(f"{m + ' geo':>12}{m + ' sum':>12}" for m in modes) + f"{'rows':>6}")
    for kernel_type in kernel_types:
        cells, rows = [], 0
        for mode in modes:
            selected = [p for p in results[mode] if p.kernel_type == kernel_type]
            rows = max(rows, len(selected))
            if selected:
                geo, _median, _p90, total = summary(selected)
                cells.append(f"{geo:>12.3f}{total:>12.3f}")
            else:
                cells.append(f"{'-':>12}{'-':>12}")
        print(f"{kernel_type:22}" + "".join(cells) + f"{rows:>6}")
    if args.csv:
        with args.csv.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["mode", "kernel type", *IDENTITY, "in-model us", "microbench us", "ratio"])
            for mode, found in results.items():
                for p in found:
                    writer.writerow([mode, p.kernel_type, *p.identity, p.in_model_us, p.microbench_us, f"{p.ratio:.4f}"])

    summaries: dict[str, dict[str, Any]] = {}
    for mode, found in results.items():
        if found:
            geo, median, p90, total = summary(found)
            summaries[mode] = {"rows": len(found), "geomean_ratio": geo, "median_abs_deviation": median,
                               "p90_abs_deviation": p90, "sum_ratio": total}
    rows = max((len(found) for found in results.values()), default=0)
    report = {
        "benchmark": f"perf_plugin.reproduce:{NAME}",
        "script": f"reproduce/wip/{NAME}.py",
        "workflow": "pytest bench per cache mode vs in-model durations",
        "pass_n": 1,  # one replay of the database per mode
        "ops_count": rows,
        "elapsed_s": time.perf_counter() - started,
        "device_ids": [0] if args.backend == "cuda" else [],
        "max_concurrency": 1,
        "llm_concurrency": LLM_CONCURRENCY,
        "env_spec": collect_env_spec(args.backend, cwd=ROOT),
        "task_log_dir": str(out),
        "stats": {"database": str(args.database), "tokens": args.tokens, "repeats": args.repeats, "modes": summaries},
    }
    path = out / f"{NAME}.json"
    path.write_text(report_json(finite_values(report), indent=2) + "\n", encoding="utf-8")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
