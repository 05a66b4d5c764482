"""A model's database replayed without ``Profiling Input Reuse Spread(B)``, beside its replay with it.

``benchmarks/model_coverage.py`` ingests a model's trace (the spread included) and replays it
(``db_auto``).  This script copies the ingested database, strips the spread column from the copy,
so that every input is cached or not by its distance alone (the replay before the column), replays
the copy the same way and prints both reports: the figures of the "Inputs partly cached" table of
docs/coverage.md (H200, nine models; e.g. ERNIE-4.5 92.1 % of the time within 10 % without the
column, 97.0 % with it, its decode argmax 1.126 and 1.040 of its in-model time).

Prerequisites: a CUDA GPU, ``transformers``, this project installed; a model measured first.

    python benchmarks/model_coverage.py --models hf:ernie4_5_moe --layers 2 --decode-steps 4 --repeats 20 --out OUT
    python reproduce/wip/reuse_spread_effect.py --model hf:ernie4_5_moe --out OUT

Expected output: the model's report with the spread (``/auto``) and without it (``/without-spread``).
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import model_coverage  # noqa: E402

from perf_plugin.database.schema import PROFILING_INPUT_REUSE_SPREAD  # noqa: E402


def strip_column(database: Path, column: str) -> None:
    """Every CSV of ``database`` rewritten without ``column``."""
    for path in database.glob("*.csv"):
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            header = [name for name in reader.fieldnames or [] if name != column]
            rows = list(reader)
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=header, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the --models entry model_coverage.py measured")
    parser.add_argument("--out", required=True, help="the --out folder model_coverage.py wrote")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a check of the script")
    args = parser.parse_args()
    folder = Path(args.out) / args.model.replace(":", "-")
    trace_us = model_coverage.trace_kernel_us(folder / "trace.json")
    with_spread = model_coverage.ModelReport(f"{args.model}/auto", trace_kernel_us=trace_us)
    with_spread.rows = model_coverage.collect_rows(folder / "db_auto")
    model_coverage.print_report(with_spread)
    without = folder / "db_without_spread"
    shutil.rmtree(without, ignore_errors=True)
    shutil.copytree(folder / "ingested", without)
    strip_column(without, PROFILING_INPUT_REUSE_SPREAD)
    report = model_coverage.ModelReport(f"{args.model}/without-spread", trace_kernel_us=trace_us)
    report.replay_seconds = model_coverage.replay(without, args.device, args.repeats, args.warmup, "auto")
    report.rows = model_coverage.collect_rows(without)
    model_coverage.print_report(report)


if __name__ == "__main__":
    main()
