"""Which cache mode lands closest to the durations kernels had inside a real model run?

Input: a database directory ingested from a profile of a model run (``perfdb ingest`` or
``tests/perf/transformer_trace.py``), whose rows carry ``Profiling Average Duration(us)``.  For
each cache mode the directory is copied and replayed by ``pytest bench --cache-mode MODE``; each
row's microbenchmark average is set against its in-model average.

Prints, per mode: the geometric mean of microbench / in-model, the median and 90th percentile of
the absolute deviation, and the ratio of the summed durations (what a model of the whole run
would see); then the same per kernel type.  Writes every row's figures to ``--csv`` if given.

    python tests/perf/transformer_trace.py --device cuda --tokens 512 --layers 4 --iterations 3 --out /tmp/llama
    python tests/perf/cache_modes_vs_model.py --database /tmp/llama --backend cuda
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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perf_plugin.database.schema import MICROBENCH_AVERAGE, PROFILING_AVERAGE  # noqa: E402
from perf_plugin.replay.cache_modes import CACHE_MODES  # noqa: E402

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
    extra = ["--rotate-max-copies", max_copies] if max_copies else []
    subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "bench" / "test_kernels.py"), "--database-path", str(copy),
         "--backend", backend, "--cache-mode", mode, *extra, "--repeat-count", str(repeats), "-q",
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", type=Path, required=True, help="directory ingested from a model run")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--modes", default=",".join(m for m in CACHE_MODES if m != "auto"),
                        help="comma-separated cache modes; rotate:N caps rotation at N input copies")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--csv", type=Path, help="write every row's figures here")
    args = parser.parse_args()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
