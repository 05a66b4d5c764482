"""NCCL collective figures of a bench run, side by side with nccl-tests reference figures.

Backs README.md, "What has and has not run where": "NCCL collectives ran on 2 H200s".  README
gives no bandwidth or latency figure; the reference figures below are nccl-tests' on 2 NVIDIA
H200 GPUs.

It prints, for each collective, the bus bandwidth at 64, 256 and 512 MB and the latency at 1 KB
from the ``hcom_*.csv`` files, the reference figures nccl-tests gave on 2 NVIDIA H200 GPUs, and
the ratio measured / reference (bandwidth: higher is better; latency: lower is better).
nccl-tests' default dtype is float, hence ``--dtype FLOAT`` by default.

Verification missing: needs a run of the collective benchmarks on 2 NVIDIA GPUs; not run on
this version.

Prerequisites: 2 NVIDIA GPUs of one host, torch built for CUDA with NCCL, this project installed
(``pip install -e .``).  Run the benchmarks first, then this script on their output directory:

    pytest bench -m comm --comm-nproc 2 --comm-dtypes fp32 --comm-output-dir /tmp/nccl
    python reproduce/wip/comm_nccl_report.py /tmp/nccl [--num-devices 2] [--dtype FLOAT] [--mode kernel] [--out DIR]

Expected output: a header line, then one line per collective (all_reduce, all_gather,
reduce_scatter, all_to_all): measured bus bandwidth, reference and ratio at each size, latency
at 1 KB, reference and ratio; then ``DIR/comm_nccl_report.json`` (by default in a new
temporary directory) with the same under ``stats.ops``.  Exit status 1 when no row matched.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perf_plugin.report.environment import collect_env_spec
from perf_plugin.report.run_json import LLM_CONCURRENCY, finite_values, report_json

NAME = "comm_nccl_report"

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
    """Rows of one file for the chosen group size, dtype and mode, keyed by nccl-tests' size
    (``nccl_tests_bytes``; ``message_bytes`` is the Ascend reader's per-rank size, which differs
    for all_gather and reduce_scatter; files written before that column hold nccl-tests' size
    there)."""
    if not path.exists():
        return {}
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {
        int(row.get("nccl_tests_bytes") or row["message_bytes"]): row
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help="directory holding the hcom_*.csv files of the run")
    parser.add_argument("--num-devices", type=int, default=2)
    parser.add_argument("--dtype", default="FLOAT", help="database dtype name (FLOAT, DT_BF16, ...)")
    parser.add_argument("--mode", default="kernel", choices=("kernel", "event"))
    parser.add_argument("--out", type=Path, help=f"directory of {NAME}.json (default: a new temporary directory)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print(f"{args.directory}: {args.num_devices} devices, dtype {args.dtype}, {args.mode} mode")
    header = (
        f"{'op':<15}" + "".join(f"{f'busbw {s // MiB}MB':>14}{'ref':>7}{'x':>6}" for s in SIZES)
        + f"{'lat 1KB us':>12}{'ref':>7}{'x':>6}"
    )
    print(header)
    found = 0
    ops: dict[str, dict[str, Any]] = {}
    for op, (file_name, ref_bw, ref_lat) in REFERENCE.items():
        rows = load(args.directory / file_name, args.num_devices, args.dtype, args.mode)
        found += len(rows)
        parts = [f"{op:<15}"]
        figures: dict[str, Any] = {"rows": len(rows), "bus_bandwidth_gbps": {}}
        for size, reference in zip(SIZES, ref_bw):
            measured = cell(rows, size, "bus_bandwidth_gbps")
            parts.append(f"{fmt(measured):>14}{reference:>7.1f}{ratio(measured, reference):>6}")
            figures["bus_bandwidth_gbps"][str(size)] = {"measured": measured, "reference": reference}
        latency = cell(rows, LATENCY_SIZE, "Duration(us)")
        parts.append(f"{fmt(latency, 2):>12}{ref_lat:>7.1f}{ratio(latency, ref_lat):>6}")
        figures["latency_1kb_us"] = {"measured": latency, "reference": ref_lat}
        ops[op] = figures
        print("".join(parts))
    if not found:
        print("no matching rows: check the directory, --num-devices, --dtype and --mode", file=sys.stderr)
        return 1
    out = args.out or Path(tempfile.mkdtemp(prefix=f"{NAME}_"))
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": f"perf_plugin.reproduce:{NAME}",
        "script": f"reproduce/wip/{NAME}.py",
        "workflow": "pytest bench -m comm vs nccl-tests",
        "pass_n": 1,
        "ops_count": len(REFERENCE),
        "elapsed_s": time.perf_counter() - started,
        "device_ids": list(range(args.num_devices)),
        "max_concurrency": args.num_devices,  # one rank per device
        "llm_concurrency": LLM_CONCURRENCY,
        "env_spec": collect_env_spec("cuda"),
        "task_log_dir": str(args.directory),
        "stats": {"num_devices": args.num_devices, "dtype": args.dtype, "mode": args.mode, "rows": found, "ops": ops},
    }
    path = out / f"{NAME}.json"
    path.write_text(report_json(finite_values(report), indent=2) + "\n", encoding="utf-8")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
