"""``perfdb validate-comm``: compare two collective databases (the seed's validate_comm_alignment.py).

    perfdb validate-comm BASELINE CANDIDATE [--threshold 0.1] [--gate] [--all] [--output report.csv]

BASELINE and CANDIDATE are two ``hcom_*.csv`` files or two directories of them.  Prints the pairs
whose duration deviates by more than the threshold (every pair with ``--all``) and a summary;
``--gate`` exits 1 when any pair deviates or nothing could be compared.  Also runs as
``python -m perf_plugin.comm.command``.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Sequence

from perf_plugin.comm.validate import KEY_ORDER, Comparison, Pair, compare_paths
from perf_plugin.database.atomic import atomic_write_text
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import format_number

DEFAULT_THRESHOLD = 0.1


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "validate-comm",
        help="compare two collective databases and report deviations",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("baseline", help="hcom_*.csv file or directory of them (the reference)")
    parser.add_argument("candidate", help="hcom_*.csv file or directory of them (the one checked)")
    parser.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"relative deviation allowed, e.g. 0.1 for 10%% (default {DEFAULT_THRESHOLD})",
    )
    parser.add_argument("--gate", action="store_true", help="exit 1 if any pair deviates or nothing matched")
    parser.add_argument("--all", action="store_true", help="print every compared pair, not only deviations")
    parser.add_argument("--output", metavar="CSV", help="also write every compared pair to this CSV")
    parser.set_defaults(func=run)
    return parser


def _key_text(pair: Pair) -> str:
    return " ".join(f"{name}={value}" for name, value in pair.key if value not in (None, ""))


def _pair_line(pair: Pair, threshold: float) -> str:
    flag = "DEVIATES" if abs(pair.deviation) > threshold else "ok"
    return (
        f"{pair.op or '-':<15} {_key_text(pair):<60} baseline {pair.baseline_us:>12.3f} us  "
        f"candidate {pair.candidate_us:>12.3f} us  {pair.deviation:+8.1%}  {flag}"
    )


def report_csv(comparison: Comparison) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    present = {name for pair in comparison.pairs for name, _ in pair.key}
    names = [name for name in KEY_ORDER if name in present]
    writer.writerow(["op", *names, "baseline_us", "candidate_us", "deviation", "flagged"])
    for pair in comparison.pairs:
        values = dict(pair.key)
        writer.writerow(
            [
                pair.op,
                *("" if values.get(n) is None else values.get(n) for n in names),
                format_number(pair.baseline_us, 3),
                format_number(pair.candidate_us, 3),
                format_number(pair.deviation, 6),
                int(abs(pair.deviation) > comparison.threshold),
            ]
        )
    return buffer.getvalue()


def run(args: argparse.Namespace) -> int:
    comparison = compare_paths(args.baseline, args.candidate, args.threshold)
    shown = comparison.pairs if args.all else comparison.flagged
    for pair in shown:
        print(_pair_line(pair, comparison.threshold))
    print(
        f"validate-comm: {len(comparison.pairs)} compared, {len(comparison.flagged)} beyond "
        f"±{comparison.threshold * 100:g}%; only in baseline {comparison.only_baseline}, only in candidate "
        f"{comparison.only_candidate}; rows without a duration {comparison.skipped}"
    )
    if args.output:
        atomic_write_text(args.output, report_csv(comparison))
        print(f"validate-comm: pairs written to {args.output}")
    if args.gate and (comparison.flagged or not comparison.pairs):
        if not comparison.pairs:
            print("validate-comm: nothing to compare (no rows matched)", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf_plugin.comm.command")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    register(subparsers)
    args = parser.parse_args(["validate-comm", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except DatabaseError as exc:
        print(f"validate-comm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
