"""Real-format Ascend profile files for tests: a ``kernel_details.csv`` built on the real Level1
profile's header and rows (tests/fixtures/ascend/SOURCES.md), with the kernels a test launches."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping

from tests.conftest import ASCEND


def kernel_details_text(kernels: Iterable[Mapping[str, str]]) -> str:
    """The real Level1 header and first two rows, then one row per kernel: the real MatMulV2 row's
    cells with the kernel's own (columns the header lacks are left out)."""
    with (ASCEND / "kernel_details_level1.csv").open(newline="", encoding="utf-8-sig") as handle:
        records = list(csv.reader(handle))
    header, template = records[0], next(r for r in records[1:] if r[5] == "MatMulV2")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows([header, records[1], records[2]])
    for kernel in kernels:
        cells = dict(zip(header, template))
        cells.update({k: v for k, v in kernel.items() if k in cells})
        writer.writerow([cells[name] for name in header])
    return out.getvalue()
