"""Rows set aside and brought back: ``{KernelType}.quarantine.csv`` beside a kernel CSV.

Write-back sets aside only rows whose cells cannot be parsed at all (a malformed shape, an
unknown dtype), never a row for what a replay cannot do.  The quarantine file keeps every column
of the row as it was, plus the reason, when, and the row's 1-based line in the kernel CSV;
``restore`` puts the rows back into their kernel CSV (after the cells were fixed, or once a
newer version parses them) with one command, ``perfdb restore-quarantine``.

Each row goes back to the line it left, so that a file nobody touched since comes back byte for
byte (a database is reviewed in diffs): the rows of the latest write-back first, each before the
first row that now starts at or past its line, then those of the write-backs before it, whose
lines are those of the file as it was then.  Where rows were added or removed since, a row lands
near its line, and restored rows keep their order.  Rows from a quarantine file written before
the line was recorded go to the end of the file, and the result says how many.

Restoring is safe to repeat and to interrupt: the kernel CSV is written first (atomically), and
a row already in it, cell for cell, is not added again (each copy there stands for one row of the
quarantine file), nor is a row set aside twice from the same line (a write-back interrupted
between the two files); only then is the quarantine file removed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.lock import database_lock
from perf_plugin.database.table import CsvTable

QUARANTINE_SUFFIX = ".quarantine.csv"
QUARANTINE_REASON = "Quarantine Reason"
QUARANTINE_TIME = "Quarantine Timestamp"
QUARANTINE_LINE = "Quarantine Original Line"  # the row's 1-based line in the kernel CSV it left
QUARANTINE_COLUMNS = (QUARANTINE_REASON, QUARANTINE_TIME, QUARANTINE_LINE)


def quarantine_path(directory: Path, csv_file: str) -> Path:
    """The quarantine file of kernel CSV ``csv_file`` in ``directory``."""
    return directory / (Path(csv_file).stem + QUARANTINE_SUFFIX)


def set_aside(directory: Path, csv_file: str, table: CsvTable, rows: Iterable[tuple[int, str]], timestamp: str) -> Path:
    """Append ``rows`` (index, reason) of ``table`` to the quarantine file; every column kept.

    Written before the rows leave the kernel CSV, so an interruption duplicates rows (which
    ``restore`` recognises) but never loses one.
    """
    path = quarantine_path(directory, csv_file)
    quarantine = CsvTable.read(path) if path.exists() else CsvTable.new(table.header, table.newline)
    for column in QUARANTINE_COLUMNS:
        if not quarantine.has_column(column):
            quarantine.insert_column(column)
    for index, reason in rows:
        values = table.row_dict(index)
        values[QUARANTINE_REASON] = reason
        values[QUARANTINE_TIME] = timestamp
        line = table.line_of(index)
        values[QUARANTINE_LINE] = str(line) if line is not None else ""
        quarantine.append_row(values)
    quarantine.write(path)
    return path


@dataclass(frozen=True)
class RestoredFile:
    quarantine_file: Path
    kernel_csv: Path
    restored: int  # rows put back into the kernel CSV
    already_there: int  # rows the kernel CSV held already, cell for cell
    at_the_end: int = 0  # restored rows whose line the quarantine file does not record: appended


def kernel_csv_of(quarantine_file: Path) -> Path:
    return quarantine_file.with_name(quarantine_file.name[: -len(QUARANTINE_SUFFIX)] + ".csv")


def _row_key(values: dict[str, str], columns: Iterable[str]) -> tuple[str, ...]:
    return tuple(values.get(column, "") for column in columns)


def _original_line(text: str) -> int | None:
    """The recorded line (None: a quarantine file written before lines were recorded)."""
    text = text.strip()
    return int(text) if text.isdigit() and int(text) > 1 else None


Batch = list[tuple[int, dict[str, str]]]  # (original line, cells) of the rows one write-back set aside


def put_back(table: CsvTable, batch: Batch) -> None:
    """Insert each row of one write-back before the first row that now starts at or past its line.

    On the file as that write-back left it, this gives back the file before it: every row lands
    on the very line it left.  Rows past the last line go to the end, in order."""
    row = 0
    line = 1 + table.lines_in(None)  # where the first row starts
    for original, values in sorted(batch, key=lambda item: item[0]):  # stable: ties keep file order
        while row < len(table) and line < original:
            line += table.lines_in(row)
            row += 1
        table.insert_row(row, values)
        line += table.lines_in(row)
        row += 1


def restore_file(quarantine_file: Path, dry_run: bool = False) -> RestoredFile:
    """Put every row of one quarantine file back into its kernel CSV, at the line it left."""
    target = kernel_csv_of(quarantine_file)
    quarantine = CsvTable.read(quarantine_file)
    columns = [c for c in quarantine.header if c not in QUARANTINE_COLUMNS]
    table = CsvTable.read(target) if target.exists() else CsvTable.new(columns, quarantine.newline)
    for column in columns:
        if not table.has_column(column):
            table.insert_column(column)  # a column the kernel CSV lost since: kept, at the end
    # counted, not a set: two identical rows set aside from two lines both come back, and a row
    # already back (an interrupted restore) stands for one copy only
    present = Counter(_row_key(table.row_dict(i), columns) for i in range(len(table)) if not table.is_blank(i))
    seen: set[tuple[tuple[str, ...], int | None]] = set()  # a row set aside twice from one line: once
    batches: list[Batch] = []  # by write-back (a timestamp), oldest first
    batch_time: str | None = None
    unplaced: list[dict[str, str]] = []
    already = 0
    for index in range(len(quarantine)):
        if quarantine.is_blank(index):
            continue
        cells = quarantine.row_dict(index)
        values = {c: v for c, v in cells.items() if c not in QUARANTINE_COLUMNS}
        key = _row_key(values, columns)
        line = _original_line(cells.get(QUARANTINE_LINE, ""))
        if (key, line) in seen:  # a write-back interrupted before the kernel CSV was rewritten
            already += 1
            continue
        seen.add((key, line))
        if present[key] > 0:
            present[key] -= 1
            already += 1
            continue
        if line is None:
            unplaced.append(values)
            continue
        if not batches or cells.get(QUARANTINE_TIME, "") != batch_time:
            batches.append([])
            batch_time = cells.get(QUARANTINE_TIME, "")
        batches[-1].append((line, values))
    # latest first: an earlier write-back's lines are those of the file before the later ones
    for batch in reversed(batches):
        put_back(table, batch)
    for values in unplaced:
        table.append_row(values)
    restored = sum(len(batch) for batch in batches) + len(unplaced)
    if not dry_run:
        if restored:
            table.write(target)
        quarantine_file.unlink()
    return RestoredFile(quarantine_file, target, restored, already, len(unplaced))


def restore(directory: Path, kernel_types: Iterable[str] = (), dry_run: bool = False, lock_timeout: float = 60.0) -> list[RestoredFile]:
    """Restore the quarantine files of ``directory`` (of ``kernel_types`` only, when given)."""
    if not directory.is_dir():
        raise DatabaseError("not a database directory", path=directory)
    wanted = set(kernel_types)
    files = sorted(
        path for path in directory.glob(f"*{QUARANTINE_SUFFIX}")
        if not wanted or path.name[: -len(QUARANTINE_SUFFIX)] in wanted
    )
    missing = wanted - {path.name[: -len(QUARANTINE_SUFFIX)] for path in files}
    if missing:
        raise DatabaseError(f"no quarantine file for {', '.join(sorted(missing))}", path=directory)
    with database_lock(directory, lock_timeout):
        return [restore_file(path, dry_run) for path in files]
