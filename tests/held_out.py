"""A measured database with some rows held out, as ``benchmarks/lookup_accuracy.py`` asks them:
the lookup tests on real rows write a fixture's CSV without the rows they then ask."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from perf_plugin.database.table import CsvTable


def write_without(csv: Path, into: Path, held: Callable[[int, dict[str, str]], bool]) -> list[dict[str, str]]:
    """``csv`` written into the directory ``into`` under its own name without the rows ``held``
    picks (by line, the header being line 1, and cells); those rows' cells, in order."""
    table = CsvTable.read(csv)
    kept = CsvTable.new(table.header)
    taken = []
    for index in range(len(table)):
        cells = table.row_dict(index)
        if held(index + 2, cells):
            taken.append(cells)
        else:
            kept.append_row(cells)
    kept.write(into / csv.name)
    return taken
