"""How well ``perf_plugin.lookup`` answers for rows it did not see: held-out error per kernel type.

For each kernel CSV of a measured database (``--kernel-types``, default every one with measured
rows), the rows with a duration are split at random (``--seed``): ``--holdout`` of them (20 %) are
held out, the rest are written to a scratch database (with the database's ``device_peaks.yaml``
and ``op_mapping.yaml``), and every held-out row is asked of it by its inputs.  Per kernel type
the table gives how many held-out rows the lookup answered by interpolation (and how many fell
outside the measured hull, answered by a fallback, with their median error), and the median and
P90 absolute percentage error (APE) of the interpolated answers against the row's own measured
duration; ``--roofline`` adds the error of the roofline alone (the
device's peaks, no rows) over the same rows, ``--policy`` the answer ``op_mapping.yaml``'s
``interpolation_policy`` gives (as the Ascend performance model reads the same files; ``--op-mapping
FILE`` when the database has none); ``--without-learned`` answers GEMMs with the median deviation
of alike weights instead of the learned one (``perf_plugin/lookup/learned.py``).
``--leave-one-out`` asks every row of a database without that row instead; ``--plots DIR`` draws
each kernel type's errors against the query's work (needs matplotlib: ``pip install -e ".[plot]"``).

Prerequisites: this project installed (``pip install -e .``); a database whose rows were
measured (``pytest bench`` wrote ``Average Duration(us)``), e.g. the ones
``reproduce/lookup_accuracy_cuda.sh`` measures, with ``perfdb peaks``' file beside it.

    python benchmarks/lookup_accuracy.py --database-path DIR [--kernel-types MatMulV2] [--roofline] [--policy]

Expected output: one line per kernel type and method, ``kernel type  method  asked  answered
median APE  P90 APE`` (``--out FILE`` also writes every asked row's answers and errors as JSON).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from perf_plugin.database.table import CsvTable
from perf_plugin.lookup import learned, lookup
from perf_plugin.lookup.api import family
from perf_plugin.lookup.command import make_query
from perf_plugin.lookup.peaks import PEAKS_FILE, find_peaks
from perf_plugin.lookup.roofline import ideal_us
from perf_plugin.lookup.rows import read_rows

METHODS = ("lookup", "roofline", "policy")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def measured_lines(path: Path) -> list[int]:
    return [row.line for row in read_rows(path) if row.duration_us is not None]


def _scratch(path: Path, held_out: list[int], scratch: Path, mapping: Path | None) -> None:
    table = CsvTable.read(path)
    held = set(held_out)
    kept = CsvTable.new(table.header)
    for index in range(len(table)):
        if index + 2 not in held:
            kept.append_row(table.row_dict(index))
    kept.write(scratch / path.name)
    peaks = find_peaks(path.parent)
    if peaks is not None and peaks.path is not None:
        shutil.copy(peaks.path, scratch / PEAKS_FILE)
    if mapping is not None:
        shutil.copy(mapping, scratch / "op_mapping.yaml")


def _ape(answer_us: float | None, measured: float) -> float | str:
    return "" if answer_us is None else abs(answer_us - measured) / measured * 100


def ask(path: Path, held_out: list[int], scratch: Path, mapping: Path | None, methods: tuple[str, ...]) -> list[dict[str, Any]]:
    """Write ``path`` without the ``held_out`` lines into ``scratch``, then ask each of them."""
    _scratch(path, held_out, scratch, mapping)
    table = CsvTable.read(path)
    truth = {row.line: row.duration_us for row in read_rows(path)}
    peaks = find_peaks(scratch)
    results = []
    for line in held_out:
        query = make_query({"Kernel Type": path.stem, **table.row_dict(line - 2)})
        measured = truth[line]
        assert measured is not None
        answer = lookup(scratch, query)
        result: dict[str, Any] = {"line": line, "measured_us": measured, "provenance": answer.provenance,
                                  "lookup_us": answer.duration_us, "lookup_ape": _ape(answer.duration_us, measured)}
        methods_of = family(path.stem)
        work = methods_of[1](query) if methods_of else None
        result["flops"], result["bytes"] = (work.flops, work.nbytes) if work else ("", "")
        if "roofline" in methods:
            ideal = ideal_us(work, peaks) if work is not None and peaks is not None else None
            result["roofline_us"] = ideal[0] if ideal else None
            result["roofline_ape"] = _ape(result["roofline_us"], measured)
        if "policy" in methods:
            from perf_plugin.lookup.policy import lookup_by_policy

            policy = lookup_by_policy(scratch, query)
            result["policy_us"] = policy.duration_us
            result["policy_ape"] = _ape(policy.duration_us, measured)
        results.append(result)
    return results


def evaluate(path: Path, holdout: float, leave_one_out: bool, seed: int, mapping: Path | None,
             methods: tuple[str, ...]) -> list[dict[str, Any]]:
    lines = measured_lines(path)
    with tempfile.TemporaryDirectory() as scratch:
        if leave_one_out:
            return [r for line in lines for r in ask(path, [line], Path(scratch), mapping, methods)]
        rng = random.Random(seed)
        held = sorted(rng.sample(lines, max(1, int(holdout * len(lines))))) if lines else []
        return ask(path, held, Path(scratch), mapping, methods)


def summary(name: str, results: list[dict[str, Any]], method: str) -> str:
    if method == "lookup":
        errors = [float(r["lookup_ape"]) for r in results if r["provenance"] == "interpolated"]
        others = [float(r["lookup_ape"]) for r in results if r["provenance"] in ("fallback", "roofline")]
        label = f"interpolated (+{len(others)} outside: {statistics.median(others):.0f}%)" if others else "interpolated"
    else:
        errors = [float(r[f"{method}_ape"]) for r in results if r.get(f"{method}_ape", "") != ""]
        label = method
    median = f"{statistics.median(errors):.2f}%" if errors else "-"
    p90 = f"{percentile(errors, 0.9):.2f}%" if errors else "-"
    return f"{name:<26} {label:<28} {len(results):>6} {len(errors):>8} {median:>10} {p90:>8}"


def plot(directory: Path, name: str, results: list[dict[str, Any]], methods: tuple[str, ...]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for method in methods:
        # errors below 0.01 % drawn at 0.01 %: a log axis has no zero
        points = [(float(r["flops"] or r["bytes"] or 1), max(0.01, float(r[f"{method}_ape"]))) for r in results
                  if r.get(f"{method}_ape", "") != "" and (method != "lookup" or r["provenance"] == "interpolated")]
        if points:
            axes.scatter(*zip(*points), s=8, label=method, alpha=0.6)
    axes.set(xscale="log", yscale="log", ylim=(0.01, None), xlabel="query's work (FLOP, or bytes)", ylabel="absolute error (%)",
             title=f"{name}: held-out rows")
    axes.legend()
    directory.mkdir(parents=True, exist_ok=True)
    figure.savefig(directory / f"{name}.png", dpi=120, bbox_inches="tight")
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-path", type=Path, required=True)
    parser.add_argument("--kernel-types", default="", help="comma list (default: every CSV with measured rows)")
    parser.add_argument("--holdout", type=float, default=0.2)
    parser.add_argument("--leave-one-out", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--roofline", action="store_true", help="also the roofline-only answer's error")
    parser.add_argument("--policy", action="store_true", help="also the op_mapping.yaml policy answer's error")
    parser.add_argument("--op-mapping", type=Path, help="the policy's op_mapping.yaml (default: the database's)")
    parser.add_argument("--plots", type=Path, help="a directory for one error plot per kernel type")
    parser.add_argument("--without-learned", action="store_true",
                        help="GEMMs take the median deviation of alike weights, not the learned one (lookup/learned.py)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.without_learned:
        learned.MIN_EXAMPLES = sys.maxsize  # no family has that many rows: every one keeps the median
    mapping = args.op_mapping or (args.database_path / "op_mapping.yaml")
    methods = ("lookup",) + (("roofline",) if args.roofline else ()) + (("policy",) if args.policy else ())
    names = [n for n in args.kernel_types.split(",") if n] or sorted(
        p.stem for p in args.database_path.glob("*.csv")
        if not p.name.endswith(".quarantine.csv") and measured_lines(p))
    report = {}
    print(f"{'kernel type':<26} {'method':<28} {'asked':>6} {'answered':>8} {'median APE':>10} {'P90 APE':>8}")
    for name in names:
        results = evaluate(args.database_path / f"{name}.csv", args.holdout, args.leave_one_out, args.seed,
                           mapping if mapping.is_file() else None, methods)
        for method in methods:
            print(summary(name, results, method))
        if args.plots:
            plot(args.plots, name, results, methods)
        report[name] = results
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
