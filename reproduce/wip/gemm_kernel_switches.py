"""Where a GEMM lookup's held-out error comes from: the library's choice of kernel at each token count.

Reads a GEMM database replayed on CUDA (``MicroBench Kernels`` names the kernel cuBLAS ran for
each row) and the answers ``benchmarks/lookup_accuracy.py --out FILE`` gave for its held-out
rows, and splits the interpolated answers' absolute errors by whether the held-out row ran the
same kernel as its nearest measured neighbours along the token count (same weight): both, one,
or neither.  It also gives a floor for any answer drawn between the two neighbours: the error
left when the answer is the best point between the times the neighbours imply at the query
(each neighbour's time rescaled by the roofline, as the lookup rescales them).

Prerequisites: a database from ``bash reproduce/lookup_accuracy_cuda.sh dense-gemm OUT`` (or
``gemm``) on a CUDA GPU, then, anywhere:

    python benchmarks/lookup_accuracy.py --database-path OUT/db --out OUT/answers.json
    python reproduce/wip/gemm_kernel_switches.py OUT/db OUT/answers.json

Expected output: per kernel type, the count, median and P90 absolute error of the interpolated
answers whose row ran the same kernel as both neighbours, as one, as neither; then the floor's P90
and the share of held-out rows more than 6 % outside their neighbours' span.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import yaml

KERNEL_TYPES = {"MatMulV2": ("BF16", 2), "aten._scaled_mm": ("FLOAT8_E4M3FN", 1)}
Series = dict[tuple[int, ...], list[tuple[int, int, str, float]]]  # weight -> (M, line, kernel, us)


def read_series(path: Path) -> Series:
    series: Series = defaultdict(list)
    with path.open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            activation, weight = row["Input Shapes"].strip('"').split(";")[:2]
            tokens = int(activation.split(",")[0])
            kernel = "|".join(sorted(part.rsplit("=", 1)[0] for part in row["MicroBench Kernels"].split(";") if part))
            series[tuple(int(v) for v in weight.split(","))].append((tokens, line, kernel, float(row["Average Duration(us)"])))
    for points in series.values():
        points.sort()
    return series


def roofline_us(tokens: int, weight: tuple[int, ...], element_bytes: int, tflops: float, gbps: float) -> float:
    n, k = weight[0], weight[1]
    flops, moved = 2 * tokens * n * k, (tokens * k + k * n) * element_bytes + tokens * n * 2
    return max(flops / (tflops * 1e12), moved / (gbps * 1e9)) * 1e6


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.9 * len(ordered))]


def report(kernel_type: str, series: Series, answers: list[dict], peaks: dict) -> None:
    held = {a["line"]: a for a in answers}
    dtype, element_bytes = KERNEL_TYPES[kernel_type]
    split: dict[str, list[float]] = defaultdict(list)
    floor: list[float] = []
    for weight, points in series.items():
        for j, (tokens, line, kernel, measured) in enumerate(points):
            answer = held.get(line)
            if answer is None or answer["provenance"] != "interpolated":
                continue
            below = next((p for p in reversed(points[:j]) if p[1] not in held), None)
            above = next((p for p in points[j + 1 :] if p[1] not in held), None)
            neighbours = [p for p in (below, above) if p is not None]
            same = sum(p[2] == kernel for p in neighbours)
            split[{2: "both", 1: "one", 0: "neither"}[same]].append(answer["lookup_ape"])
            roof = [roofline_us(p[0], weight, element_bytes, peaks["matmul_tflops"][dtype], peaks["copy_gbps"])
                    for p in (*neighbours, (tokens,))]
            implied = [p[3] * roof[-1] / r for p, r in zip(neighbours, roof)]
            low, high = min(implied), max(implied)
            floor.append(0.0 if low <= measured <= high else 100 * min(abs(measured - low), abs(measured - high)) / measured)
    print(kernel_type)
    for label in ("both", "one", "neither"):
        errors = split[label]
        if errors:
            print(f"  same kernel as {label:7} neighbours: {len(errors):4} answers, median {statistics.median(errors):.2f} %,"
                  f" P90 {p90(errors):.2f} %")
    share = 100 * sum(gap > 6 for gap in floor) / len(floor)
    print(f"  floor (the best answer between the neighbours): P90 {p90(floor):.2f} %, {share:.1f} % of answers over 6 %")


def main() -> None:
    database, answers_path = Path(sys.argv[1]), Path(sys.argv[2])
    answers = json.loads(answers_path.read_text())
    peaks = yaml.safe_load((database / "device_peaks.yaml").read_text())
    for kernel_type in KERNEL_TYPES:
        if kernel_type in answers and (database / f"{kernel_type}.csv").exists():
            report(kernel_type, read_series(database / f"{kernel_type}.csv"), answers[kernel_type], peaks)


if __name__ == "__main__":
    main()
