"""NCCL collective figures of a bench run, side by side with nccl-tests reference figures.

Plain script (not collected by pytest).  Run the benchmarks first, e.g. on 2 GPUs:

    pytest bench -m comm --comm-nproc 2 --comm-dtypes fp32 --comm-output-dir /tmp/nccl
    python tests/perf/comm_nccl_report.py /tmp/nccl [--num-devices 2] [--dtype FLOAT] [--mode kernel]

It prints, for each collective, the bus bandwidth at 64, 256 and 512 MB and the latency at 1 KB
from the ``hcom_*.csv`` files, the reference figures nccl-tests gave on 2 NVIDIA H200 GPUs, and
the ratio measured / reference (bandwidth: higher is better; latency: lower is better).
nccl-tests' default dtype is float, hence ``--dtype FLOAT`` by default.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

MiB = 1 << 20
SIZES = (64 * MiB, 256 * MiB, 512 * MiB)
LATENCY_SIZE = 1024
# op: (file, busbw GB/s at 64/256/512 MB, latency us at 1 KB), nccl-tests on 2 H200
REFERENCE = {
    "all_reduce": ("hcom_allReduce_.csv", (269.0, 301.0, 312.0), 12.3),
    "all_gather": ("hcom_allGather_.csv", (215.0, 246.0, 257.0), 18.1),
    "reduce_scatter": ("hcom_reduceScatter_.csv", (210.0, 239.0, 255.0), 12.8),
    "all_to_all": ("hcom_alltoallv_.csv", (244.0, 286.0, 298.0), 14.1),
}


def load(path: Path, num_devices: int, dtype: str, mode: str) -> dict[int, dict[str, str]]:
    """Rows of one file for the chosen group size, dtype and mode, keyed by message bytes."""
    if not path.exists():
        return {}
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {
        int(row["message_bytes"]): row
        for row in rows
        if int(row["num_devices"]) == num_devices
        and row["dtype"].upper().removeprefix("DT_") == dtype.upper().removeprefix("DT_")
        and (row.get("mode") or "kernel") == mode
    }


def cell(rows: dict[int, dict[str, str]], size: int, column: str) -> float | None:
    row = rows.get(size)
    if row is None or not row.get(column):
        return None
    return float(row[column])


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(measured: float | None, reference: float) -> str:
    return "-" if measured is None else f"{measured / reference:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="directory holding the hcom_*.csv files of the run")
    parser.add_argument("--num-devices", type=int, default=2)
    parser.add_argument("--dtype", default="FLOAT", help="database dtype name (FLOAT, DT_BF16, ...)")
    parser.add_argument("--mode", default="kernel", choices=("kernel", "event"))
    args = parser.parse_args(argv)
    print(f"{args.directory}: {args.num_devices} devices, dtype {args.dtype}, {args.mode} mode")
    header = (
        f"{'op':<15}" + "".join(f"{f'busbw {s // MiB}MB':>14}{'ref':>7}{'x':>6}" for s in SIZES)
        + f"{'lat 1KB us':>12}{'ref':>7}{'x':>6}"
    )
    print(header)
    found = 0
    for op, (file_name, ref_bw, ref_lat) in REFERENCE.items():
        rows = load(args.directory / file_name, args.num_devices, args.dtype, args.mode)
        found += len(rows)
        parts = [f"{op:<15}"]
        for size, reference in zip(SIZES, ref_bw):
            measured = cell(rows, size, "bus_bandwidth_gbps")
            parts.append(f"{fmt(measured):>14}{reference:>7.1f}{ratio(measured, reference):>6}")
        latency = cell(rows, LATENCY_SIZE, "Duration(us)")
        parts.append(f"{fmt(latency, 2):>12}{ref_lat:>7.1f}{ratio(latency, ref_lat):>6}")
        print("".join(parts))
    if not found:
        print("no matching rows: check the directory, --num-devices, --dtype and --mode", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
