"""Rows set aside and brought back: ``{KernelType}.quarantine.csv`` beside a kernel CSV.

Write-back sets aside only rows whose cells cannot be parsed at all (a malformed shape, an
unknown dtype), never a row for what a replay cannot do.  The quarantine file keeps every column
of the row as it was, plus the reason and when; ``restore`` puts the rows back into their kernel
CSV (after the cells were fixed, or once a newer version parses them) with one command,
``perfdb restore-quarantine``.

Restoring is safe to repeat and to interrupt: the kernel CSV is written first (atomically), and
a row already in it, cell for cell, is not added again; only then is the quarantine file
rewritten without the restored rows, or removed when none are left.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.lock import database_lock
from perf_plugin.database.table import CsvTable

QUARANTINE_SUFFIX = ".quarantine.csv"
QUARANTINE_REASON = "Quarantine Reason"
QUARANTINE_TIME = "Quarantine Timestamp"
QUARANTINE_COLUMNS = (QUARANTINE_REASON, QUARANTINE_TIME)


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
        quarantine.append_row(values)
    quarantine.write(path)
    return path


@dataclass(frozen=True)
class RestoredFile:
    quarantine_file: Path
    kernel_csv: Path
    restored: int  # rows appended to the kernel CSV
    already_there: int  # rows the kernel CSV held already, cell for cell


def kernel_csv_of(quarantine_file: Path) -> Path:
    return quarantine_file.with_name(quarantine_file.name[: -len(QUARANTINE_SUFFIX)] + ".csv")


def _row_key(values: dict[str, str], columns: Iterable[str]) -> tuple[str, ...]:
    return tuple(values.get(column, "") for column in columns)


def restore_file(quarantine_file: Path, dry_run: bool = False) -> RestoredFile:
    """Put every row of one quarantine file back into its kernel CSV."""
    target = kernel_csv_of(quarantine_file)
    quarantine = CsvTable.read(quarantine_file)
    columns = [c for c in quarantine.header if c not in QUARANTINE_COLUMNS]
    table = CsvTable.read(target) if target.exists() else CsvTable.new(columns, quarantine.newline)
    for column in columns:
        if not table.has_column(column):
            table.insert_column(column)  # a column the kernel CSV lost since: kept, at the end
    present = {_row_key(table.row_dict(i), columns) for i in range(len(table)) if not table.is_blank(i)}
    restored = already = 0
    for index in range(len(quarantine)):
        if quarantine.is_blank(index):
            continue
        values = {c: v for c, v in quarantine.row_dict(index).items() if c not in QUARANTINE_COLUMNS}
        key = _row_key(values, columns)
        if key in present:
            already += 1
            continue
        present.add(key)
        table.append_row(values)
        restored += 1
    if not dry_run:
        if restored:
            table.write(target)
        quarantine_file.unlink()
    return RestoredFile(quarantine_file, target, restored, already)


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
