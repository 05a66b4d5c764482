"""How far a GEMM row's duration moves between two measurement sessions, against the lookup's error.

``benchmarks/lookup_accuracy.py --out FILE`` writes every held-out row's answer and its error
against the database it held the row out of.  A second session's measurement of the same rows
(another machine of the same kind, another day: the shipped-density grid measured apart from the
dense grid) says what that error is made of: the rows of both sessions are matched by their
identity cells, and the script prints, over the held-out rows the second session measured too,
the answers' absolute error against the first session, the second and their mean, beside the two
sessions' own difference (the second session's duration as the answer: what re-measuring gives).

Result on NVIDIA H200s (torch 2.11, CUDA 13), the dense grid's learned answers (seed 0: bf16
1.31 % / 6.86 %, fp8 1.09 % / 5.58 % over every held-out row) against the shipped-density
session, median / P90:

    kernel type        rows in both  held out in both  vs first       vs second      vs their mean  second vs first
    MatMulV2 (bf16)    1600          321               1.46 / 7.80    2.43 / 9.55    1.96 / 7.99    1.41 / 5.84
    aten._scaled_mm    1575          316               1.16 / 5.56    1.82 / 6.80    1.51 / 5.90    0.95 / 4.24

Over every row both sessions measured, the second against the first: 1.51 % / 5.75 % (bf16),
1.00 % / 4.21 % (fp8).  Re-measuring a row in another session moves it by more than 5.75 % for a
tenth of the bf16 rows, and an answer made of one session's rows is further from another
session's than from its own.

Prerequisites: this project installed; two databases holding the same kernel type, each measured
by ``pytest bench``; the answers of ``benchmarks/lookup_accuracy.py --database-path FIRST --out
ANSWERS`` on the first.

    python reproduce/wip/lookup_session_spread.py --first FIRST --second SECOND --answers ANSWERS [--kernel-type MatMulV2]

Expected output: the number of rows matched, then one line per comparison, median and P90
absolute percentage error.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

IDENTITY = ("Input Shapes", "Input Data Types", "Output Shapes")


def durations(path: Path) -> dict[tuple[str, ...], tuple[int, float]]:
    """Identity cells -> (line, measured duration) of every row with an ``Average Duration(us)``."""
    found = {}
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for line, row in enumerate(rows, start=2):  # the file's line: the header is line 1
        cell = row.get("Average Duration(us)", "").strip()
        if cell:
            found[tuple(row.get(name, "") for name in IDENTITY)] = (line, float(cell))
    return found


def spread(errors: list[float]) -> str:
    ordered = sorted(errors)
    return f"{ordered[len(ordered) // 2]:.2f} % / {ordered[int(0.9 * len(ordered))]:.2f} %"


def ape(answer: float, measured: float) -> float:
    return abs(answer - measured) / measured * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=Path, required=True, help="the database the answers were made from")
    parser.add_argument("--second", type=Path, required=True, help="another session's database of the same rows")
    parser.add_argument("--answers", type=Path, required=True, help="benchmarks/lookup_accuracy.py --out on --first")
    parser.add_argument("--kernel-type", default="MatMulV2")
    args = parser.parse_args()
    first = durations(args.first / f"{args.kernel_type}.csv")
    second = durations(args.second / f"{args.kernel_type}.csv")
    both = set(first) & set(second)
    print(f"{len(first)} rows in the first session, {len(second)} in the second, {len(both)} in both")
    print(f"  the second session against the first, every row both measured: "
          f"{spread([ape(second[k][1], first[k][1]) for k in both])}")
    by_line = {line: key for key, (line, _) in first.items()}
    answers = [a for a in json.loads(args.answers.read_text())[args.kernel_type]
               if a["provenance"] == "interpolated" and by_line.get(a["line"]) in both]
    print(f"{len(answers)} held-out rows answered by interpolation and measured in both sessions:")
    pairs = [(a["lookup_us"], first[by_line[a["line"]]][1], second[by_line[a["line"]]][1]) for a in answers]
    for name, errors in (
        ("answers against the first session", [ape(answer, one) for answer, one, _ in pairs]),
        ("answers against the second session", [ape(answer, two) for answer, _, two in pairs]),
        ("answers against the mean of both", [ape(answer, (one + two) / 2) for answer, one, two in pairs]),
        ("the second session against the first", [ape(two, one) for _, one, two in pairs]),
    ):
        print(f"  {name:40s} {spread(errors)}")


if __name__ == "__main__":
    main()
