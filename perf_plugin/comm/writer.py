"""Upsert measured collective rows into ``hcom_{op}_.csv`` (rank 0 only).

A row is replaced when ``message_bytes, num_devices, dtype, topology_tier, mode`` match, and
appended otherwise.  Rows and columns the measurement does not touch keep their bytes (CsvTable
round-trips), columns missing from an existing file are added at the end, and a file that
already has ``Average Duration(us)`` (what a simulator reads first) gets the new mean there too,
so a stale value never shadows the fresh one.  A row with no ``mode`` (the seed's tool wrote
none; its default was kernel mode) counts as a kernel-mode row.  Every write holds the database lock and replaces
the file atomically: a reader sees the old file or the new one, never half of either.

Rows this writer wrote before ``message_bytes`` followed the Ascend reader (a ``backend`` cell and
no ``nccl_tests_bytes``) count their size as nccl-tests does; a file holding one is refused with
the row named, since matching a new row against it would confuse sizes: ``perfdb upgrade-comm``
rewrites such files first.
"""

from __future__ import annotations

import math
from pathlib import Path

from perf_plugin.comm.collectives import dtype_by_db_name
from perf_plugin.comm.record import (
    BACKEND,
    COLUMNS,
    DURATION,
    KEY_COLUMNS,
    MESSAGE_BYTES,
    NCCL_TESTS_BYTES,
    NUM_DEVICES,
    CommResult,
)
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.file_kind import EmptyFile
from perf_plugin.database.lock import database_lock
from perf_plugin.database.schema import MICROBENCH_AVERAGE
from perf_plugin.database.table import CsvTable

REQUIRED_COLUMNS = (MESSAGE_BYTES, NUM_DEVICES)
# Rows with no mode were written by the seed's tool, whose default bench mode is kernel.
LEGACY_MODE = "kernel"


def parse_int(text: str) -> int | None:
    """An integer cell (``1024``, ``1024.0``, ``"1024"``); None when empty; ValueError otherwise."""
    text = text.strip().strip('"').strip()
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number != int(number):
        raise ValueError(f"{text!r} is not an integer")
    return int(number)


def int_cell(table: CsvTable, row: int, column: str, path: Path) -> int | None:
    try:
        return parse_int(table.get(row, column))
    except ValueError as exc:
        raise DatabaseError(str(exc), path=path, row=table.line_of(row), column=column) from None


def _dtype_cell(table: CsvTable, row: int, column: str) -> str:
    text = table.get(row, column).strip()
    dtype = dtype_by_db_name(text)
    return dtype.db_name if dtype else text.upper()


def row_key(table: CsvTable, row: int, path: Path) -> tuple[object, ...]:
    """The comparable key of an existing row (ints parsed, dtype spelling normalised)."""
    message_bytes, num_devices, dtype, tier, mode = KEY_COLUMNS
    return (
        int_cell(table, row, message_bytes, path),
        int_cell(table, row, num_devices, path),
        _dtype_cell(table, row, dtype),
        int_cell(table, row, tier, path),
        table.get(row, mode).strip() or LEGACY_MODE,
    )


def legacy_cells(backend: str, nccl_tests_bytes: str) -> bool:
    """A row this writer wrote with nccl-tests' ``message_bytes``: it always wrote ``backend``,
    and ``nccl_tests_bytes`` since ``message_bytes`` follows the Ascend reader."""
    return bool(backend.strip()) and not nccl_tests_bytes.strip()


def is_legacy_row(table: CsvTable, row: int) -> bool:
    return legacy_cells(table.get(row, BACKEND), table.get(row, NCCL_TESTS_BYTES))


def _refuse_legacy_rows(table: CsvTable, path: Path) -> None:
    for row in range(len(table)):
        if not table.is_blank(row) and is_legacy_row(table, row):
            raise DatabaseError(
                "written with nccl-tests' message_bytes (no nccl_tests_bytes): run "
                f"'perfdb upgrade-comm {path.parent}' first",
                path=path,
                row=table.line_of(row),
                column=MESSAGE_BYTES,
            )


def _open_table(path: Path) -> CsvTable:
    if not path.exists():
        return CsvTable.new(COLUMNS)
    try:
        table = CsvTable.read(path)
    except EmptyFile:
        # nothing in it to keep, and the result in hand is measured: the file is written anew
        return CsvTable.new(COLUMNS)
    if not table.header:
        return CsvTable.new(COLUMNS)
    for column in REQUIRED_COLUMNS:
        table.index(column)  # DatabaseError naming the file and the missing column
    _refuse_legacy_rows(table, path)
    for column in COLUMNS:
        if not table.has_column(column):
            table.insert_column(column)
    return table


def upsert_result(directory: str | Path, result: CommResult, lock_timeout_s: float = 60.0) -> Path:
    """Write one result into its op's CSV in ``directory``; returns the file written."""
    directory = Path(directory)
    path = directory / result.case.op.file_name
    cells = result.cells()
    wanted = (
        result.message_bytes,
        result.case.num_devices,
        result.case.dtype.db_name,
        result.case.topology_tier,
        result.mode,
    )
    with database_lock(directory, lock_timeout_s):
        table = _open_table(path)
        table.path = path
        match = None
        for row in range(len(table)):
            if table.is_blank(row):
                continue
            if row_key(table, row, path) == wanted:
                match = row
                break
        if match is None:
            table.append_row(cells)
        else:
            for column, value in cells.items():
                table.set(match, column, value)
        if table.has_column(MICROBENCH_AVERAGE):
            table.set(match if match is not None else len(table) - 1, MICROBENCH_AVERAGE, cells[DURATION])
        table.write(path)
    return path
