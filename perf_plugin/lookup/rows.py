"""A kernel CSV's rows as lookups read them: identity cells parsed, and one duration per row.

The duration is the first of ``Average Duration(us)``, ``Profiling Average Duration(us)`` and
``Duration(us)`` that holds a finite positive value: the Ascend performance model's reader's
preference, so both answer from the same cell.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from perf_plugin.database.schema import preferred_duration
from perf_plugin.database.shapes import Shape, parse_shape_cell, split_slots
from perf_plugin.database.signature import normalise_dtype, normalise_format
from perf_plugin.database.table import CsvTable


@dataclass(frozen=True)
class MeasuredRow:
    line: int  # 1-based, the header being line 1
    input_shapes: tuple[Shape | None, ...]
    input_dtypes: tuple[str, ...]
    input_formats: tuple[str, ...]
    output_shapes: tuple[Shape | None, ...]
    duration_us: float | None
    column: str
    # every cell of the row, for the kernel families whose parameters need more than the shapes
    # (an attention row's layout and lengths, a grouped GEMM's rows per expert)
    cells: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)


def read_rows(path: Path) -> list[MeasuredRow]:
    """Every row of ``path`` whose identity cells parse (a row that does not is left out); a
    file read once per version (a CSV of queries asks the same kernel CSV many times)."""
    stat = path.stat()
    return list(_read_rows(path.resolve(), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=64)
def _read_rows(path: Path, mtime_ns: int, size: int) -> tuple[MeasuredRow, ...]:
    table = CsvTable.read(path)
    rows = []
    for index in range(len(table)):
        cells = table.row_dict(index)
        try:
            inputs = tuple(parse_shape_cell(cells.get("Input Shapes", "")))
            outputs = tuple(parse_shape_cell(cells.get("Output Shapes", "")))
        except Exception:  # noqa: BLE001  (a malformed row answers nothing; pytest bench names it)
            continue
        duration, column = preferred_duration(cells)
        rows.append(MeasuredRow(
            index + 2, inputs,
            tuple(normalise_dtype(t) for t in split_slots(cells.get("Input Data Types", ""))),
            tuple(normalise_format(t) for t in split_slots(cells.get("Input Formats", ""))),
            outputs, duration, column, cells,
        ))
    return tuple(rows)
