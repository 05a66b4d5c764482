"""A model's database replayed without one profiling column, beside its replay with it.

``benchmarks/model_coverage.py`` ingests a model's trace (every column included) and replays it
(``db_auto``).  This script copies the ingested database, strips one column from the copy (the
replay then does what it did before the column existed), replays the copy the same way and
prints both reports; ``OUT/MODEL/column_effect.json`` keeps both replays' rows.  The figures of
docs/coverage.md's tables come from it:

* ``Profiling Input Reuse Spread(B)`` ("Inputs partly cached"; H200, nine models; e.g.
  ERNIE-4.5 92.1 % of the time within 10 % without the column, 97.0 % with it, its decode argmax
  1.126 and 1.040 of its in-model time);
* ``Profiling Code Reuse Distances(kernels)`` ("Code cached on some calls": measured at the commit
  that added the column, 817a6a5, and not adopted; the column is not written since).

Prerequisites: a CUDA GPU, ``transformers``, this project installed; a model measured first.

    python benchmarks/model_coverage.py --models hf:ernie4_5_moe --layers 2 --decode-steps 4 --repeats 20 --out OUT
    python reproduce/wip/column_effect.py --model hf:ernie4_5_moe --out OUT --column "Profiling Input Reuse Spread(B)"

Expected output: the model's report with the column (``/auto``) and without it (``/without``).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import model_coverage  # noqa: E402


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
    parser.add_argument("--model", required=True, help="the --models entry (or --traces folder) model_coverage.py measured")
    parser.add_argument("--out", required=True, help="the --out folder model_coverage.py wrote")
    parser.add_argument("--column", required=True, help="the profiling column to replay without")
    parser.add_argument("--trace", help="the model's trace, where model_coverage.py replayed it with --traces "
                                        "(default: the trace.json it profiled into the model's folder)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a check of the script")
    args = parser.parse_args()
    folder = Path(args.out) / args.model.replace(":", "-")
    trace_us = model_coverage.trace_kernel_us(Path(args.trace) if args.trace else folder / "trace.json")
    with_column = model_coverage.ModelReport(f"{args.model}/auto", trace_kernel_us=trace_us)
    with_column.rows = model_coverage.collect_rows(folder / "db_auto")
    model_coverage.print_report(with_column)
    without = folder / "db_without_column"
    shutil.rmtree(without, ignore_errors=True)
    shutil.copytree(folder / "ingested", without)
    strip_column(without, args.column)
    report = model_coverage.ModelReport(f"{args.model}/without", trace_kernel_us=trace_us)
    report.replay_seconds = model_coverage.replay(without, args.device, args.repeats, args.warmup, "auto")
    report.rows = model_coverage.collect_rows(without)
    model_coverage.print_report(report)
    document = {"column": args.column, "with": [vars(row) for row in with_column.rows],
                "without": [vars(row) for row in report.rows]}
    (folder / "column_effect.json").write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
