"""How well ``lookup_collective`` answers message sizes that were not measured (docs/lookup.md).

Reads a directory of collective CSVs (``hcom_<op>_.csv``, as ``pytest bench -m comm`` writes them)
measured at sizes 2^k and 1.5 x 2^k, and for each file answers two held-out sets from the rest:
the 1.5 x 2^k sizes from the powers of two alone (the default doubling grid), and a random fifth
of the inner sizes (seed 0).  Prints the median and P90 absolute percentage error per file.

    python reproduce/collective_lookup_accuracy.py DIR

The sizes behind the docs' figures (2 NVIDIA H200, NCCL), written by
``pytest bench -m comm --comm-nproc 2 --bytes-grid SIZES --comm-output-dir DIR`` with SIZES the
40 numbers 2^k and 3 x 2^(k-1) for k = 10..29.
"""

from __future__ import annotations

import csv
import random
import statistics
import sys
import tempfile
from pathlib import Path

from perf_plugin.lookup.answer import CollectiveQuery
from perf_plugin.lookup.collectives import lookup_collective

OPS = {"hcom_allReduce_.csv": "allreduce", "hcom_allGather_.csv": "allgather",
       "hcom_reduceScatter_.csv": "reducescatter", "hcom_alltoallv_.csv": "alltoallv"}


def errors(name: str, rows: list[dict[str, str]], held: set[int]) -> list[float]:
    """Absolute percentage errors of the held-out rows, answered from a file of the others."""
    with tempfile.TemporaryDirectory() as directory:
        with open(Path(directory) / name, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(row for index, row in enumerate(rows) if index not in held)
        found = []
        for index in sorted(held):
            row = rows[index]
            answer = lookup_collective(directory, CollectiveQuery(OPS[name], int(row["message_bytes"]), int(row["num_devices"])))
            if answer.duration_us is not None:
                found.append(abs(answer.duration_us / float(row["Duration(us)"]) - 1) * 100)
        return found


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[round(0.9 * (len(ordered) - 1))]


def main(directory: Path) -> None:
    for name in OPS:
        path = directory / name
        if not path.exists():
            continue
        rows = list(csv.DictReader(path.open(newline="")))
        sizes = [int(row["message_bytes"]) for row in rows]
        inner = list(range(1, len(rows) - 1))
        halves = {i for i in inner if sizes[i] & (sizes[i] - 1)}
        random.Random(0).shuffle(inner)
        fifth = set(inner[: len(rows) // 5])
        for label, held in (("1.5x sizes from powers of two", halves), ("a random fifth", fifth)):
            found = errors(name, rows, held)
            print(f"{name:26s} {label:30s} n={len(found):3d} median {statistics.median(found):5.2f} % P90 {p90(found):5.2f} %")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
