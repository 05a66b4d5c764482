"""Throughput and peak memory of ingest's parse + aggregate on a 1,000,000-row kernel_details.

Generates, in a temporary directory, a kernel_details.csv in the real format: the header and
rows of the real Level2 profile in tests/fixtures/ascend (sampled with replacement, seeded), so
the mix of kernel types, shapes, ``N/A`` cells, embedded-quote shape cells and tab-terminated
start times is the real one; 1,000,000 rows are about 335 MB.  The measurement runs in a fresh
subprocess so that neither the generator's memory nor this process's imports count: peak memory
is that process's ``ru_maxrss``.

Prerequisites: any CPU (the targets are set for a 2-core CI machine), about 1 GiB of free
memory and 350 MB of temporary disk, this project installed (``pip install -e .``), run from a
checkout of the repository (it samples the fixture under ``tests/fixtures``).

    python benchmarks/bench_ingest.py [--rows N] [--keep DIR]

Expected output: the generated file's size, the parse and aggregate times with rows/s, the
aggregated rows and kernel types, the peak memory, and for 1,000,000 rows or more whether the
targets were met: parse + aggregate under 7 s and peak memory under 1 GiB (docs/measured.md, "Measured":
3.6 s and 664 MiB on a 2-core CPU machine).  Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests" / "fixtures" / "ascend" / "kernel_details_level2_llm_train.csv"
TARGET_SECONDS = 7.0
TARGET_BYTES = 1 << 30

_CHILD = r"""
import json, resource, sys, time
started = time.perf_counter()
from perf_plugin.ingest.profile_table import read_profile_table
from perf_plugin.ingest.aggregate import aggregate
imported = time.perf_counter()
table = read_profile_table(sys.argv[1])
parsed = time.perf_counter()
rows = aggregate(table.frame, table.counters)
done = time.perf_counter()
print(json.dumps({
    "import_s": imported - started,
    "parse_s": parsed - imported,
    "aggregate_s": done - parsed,
    "rows_read": table.rows_read,
    "compute_rows": table.compute_rows,
    "aggregated_rows": len(rows),
    "kernel_types": len({r.kernel_type for r in rows}),
    "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
}))
"""


def generate(path: Path, rows: int, seed: int = 0) -> int:
    """Write ``rows`` records sampled from the real profile; returns the file size in bytes."""
    lines = SOURCE.read_text(encoding="utf-8").splitlines(keepends=True)
    header, body = lines[0], lines[1:]
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8", newline="") as handle:
        handle.write(header)
        remaining = rows
        while remaining:
            batch = min(remaining, 20_000)
            handle.write("".join(rng.choices(body, k=batch)))
            remaining -= batch
    return path.stat().st_size


def measure(path: Path) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"measurement failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="write the generated file here instead of a temporary directory")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench_ingest_") as tmp:
        directory = args.keep or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "kernel_details.csv"
        size = generate(path, args.rows)
        figures = measure(path)

    seconds = figures["parse_s"] + figures["aggregate_s"]
    peak = figures["maxrss_kib"] * 1024
    print(f"file: {args.rows:,} rows, {size / 1e6:.1f} MB (sampled from {SOURCE.name})")
    print(
        f"parse {figures['parse_s']:.2f} s + aggregate {figures['aggregate_s']:.2f} s = {seconds:.2f} s "
        f"({figures['rows_read'] / seconds:,.0f} rows/s); imports {figures['import_s']:.2f} s"
    )
    print(
        f"result: {figures['compute_rows']:,} compute samples -> {figures['aggregated_rows']} rows "
        f"in {figures['kernel_types']} kernel types"
    )
    print(f"peak memory (ru_maxrss of the measuring process): {peak / 2**20:.0f} MiB")
    ok = True
    if args.rows >= 1_000_000:
        ok = seconds < TARGET_SECONDS and peak < TARGET_BYTES
        print(
            f"targets: < {TARGET_SECONDS:g} s and < {TARGET_BYTES / 2**30:g} GiB -> {'met' if ok else 'MISSED'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
