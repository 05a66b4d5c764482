"""The replayed rows of a ``model_coverage.py`` output directory outside [0.9, 1.1] of their
in-model time, largest share of the time first.

    python reproduce/wip/out_of_band.py OUT_DIR/MODEL

Expected output: ``out of band: X % of replayed time``, then one line per row (ratio, share of
the time, calls, shapes) with the kernels the model and the replay ran.
"""

from __future__ import annotations

import csv
import glob
import sys


def main(directory: str) -> None:
    rows = []
    for path in glob.glob(f"{directory}/*/db_auto/*.csv") + glob.glob(f"{directory}/db_auto/*.csv"):
        for line, row in enumerate(csv.DictReader(open(path)), start=2):
            try:
                profiled, replayed = float(row["Profiling Average Duration(us)"]), float(row["Average Duration(us)"])
            except (ValueError, KeyError):
                continue
            calls = int(row.get("Profiling Count") or 1)
            rows.append((profiled * calls, replayed / profiled, path.split("/")[-1], line, row))
    total = sum(r[0] for r in rows)
    if not total:
        print("  no replayed rows")
        return
    out = sorted((r for r in rows if not 0.9 <= r[1] <= 1.1), key=lambda r: -r[0])
    print(f"  out of band: {100 * sum(r[0] for r in out) / total:.1f} % of replayed time, {len(out)} of {len(rows)} rows")
    for share, ratio, name, line, row in out[:8]:
        print(f"  {name}:{line} ratio {ratio:.3f} share {100 * share / total:.2f} % n={row.get('Profiling Count')} "
              f"in={row['Input Shapes'][:70]} {row['Input Data Types'][:30]}")
        print(f"      model: {row.get('Profiling Kernels', '')[:140]}")
        print(f"      bench: {row.get('MicroBench Kernels', '')[:140]}")


if __name__ == "__main__":
    main(sys.argv[1])
