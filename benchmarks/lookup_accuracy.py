"""How well ``perf_plugin.lookup`` answers for rows it did not see: held-out error per kernel type.

For each kernel CSV of a measured database (``--kernel-types``, default every one with measured
rows), the rows with a duration are split at random (``--seed``): ``--holdout`` of them (20 %) are
held out, the rest are written to a scratch database, and every held-out row is asked of it by
its inputs.  The table gives, per kernel type, how many held-out rows got an answer (interpolated;
the others fall outside the measured hull or have no neighbour) and the median and P90 absolute
percentage error of those answers against the row's own measured duration.  ``--leave-one-out``
asks every row of a database without that row instead.

Prerequisites: this project installed (``pip install -e .``); a database whose rows were
measured (``pytest bench`` wrote ``Average Duration(us)``), e.g. a ``perfdb grid`` of GEMM shapes
replayed on a GPU.

    python benchmarks/lookup_accuracy.py --database-path DIR [--kernel-types MatMulV2] [--leave-one-out]

Expected output: one line per kernel type, ``kernel type  rows  asked  answered  median APE  P90 APE``
(``--out FILE`` also writes every asked row's answer and error as JSON).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

from perf_plugin.database.table import CsvTable
from perf_plugin.lookup import lookup
from perf_plugin.lookup.command import make_query
from perf_plugin.lookup.rows import read_rows


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def measured_lines(path: Path) -> list[int]:
    return [row.line for row in read_rows(path) if row.duration_us is not None]


def ask(path: Path, held_out: list[int], scratch: Path) -> list[dict[str, float | int | str]]:
    """Write ``path`` without the ``held_out`` lines into ``scratch``, then ask each of them."""
    table = CsvTable.read(path)
    keep = [i for i in range(len(table)) if i + 2 not in set(held_out)]
    kept = CsvTable.new(table.header)
    for index in keep:
        kept.append_row(table.row_dict(index))
    kept.write(scratch / path.name)
    truth = {row.line: row.duration_us for row in read_rows(path)}
    results = []
    for line in held_out:
        cells = {"Kernel Type": path.stem, **table.row_dict(line - 2)}
        answer = lookup(scratch, make_query(cells))
        measured = truth[line]
        assert measured is not None
        error = None if answer.duration_us is None else abs(answer.duration_us - measured) / measured * 100
        results.append({"line": line, "measured_us": measured, "answer_us": answer.duration_us or "",
                        "provenance": answer.provenance, "ape_percent": "" if error is None else error})
    return results


def evaluate(path: Path, holdout: float, leave_one_out: bool, seed: int) -> list[dict[str, float | int | str]]:
    lines = measured_lines(path)
    with tempfile.TemporaryDirectory() as scratch:
        if leave_one_out:
            results = []
            for line in lines:
                results += ask(path, [line], Path(scratch))
            return results
        rng = random.Random(seed)
        held = sorted(rng.sample(lines, max(1, int(holdout * len(lines))))) if lines else []
        return ask(path, held, Path(scratch))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-path", type=Path, required=True)
    parser.add_argument("--kernel-types", default="", help="comma list (default: every CSV with measured rows)")
    parser.add_argument("--holdout", type=float, default=0.2)
    parser.add_argument("--leave-one-out", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    names = [n for n in args.kernel_types.split(",") if n] or sorted(
        p.stem for p in args.database_path.glob("*.csv") if not p.name.endswith(".quarantine.csv"))
    report = {}
    print(f"{'kernel type':<24} {'rows':>6} {'asked':>6} {'answered':>8} {'median APE':>10} {'P90 APE':>8}")
    for name in names:
        path = args.database_path / f"{name}.csv"
        results = evaluate(path, args.holdout, args.leave_one_out, args.seed)
        errors = [float(r["ape_percent"]) for r in results if r["ape_percent"] != ""]
        median = f"{statistics.median(errors):.2f}%" if errors else "-"
        p90 = f"{percentile(errors, 0.9):.2f}%" if errors else "-"
        print(f"{name:<24} {len(measured_lines(path)):>6} {len(results):>6} {len(errors):>8} {median:>10} {p90:>8}")
        report[name] = results
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
