"""Upgrade a collective database written before its rows followed the Ascend reader, in place.

What changes (and nothing else; every other byte of a file stays as it was):

* ``hccl/{cann}/`` becomes ``hccl/v{cann}/`` (``communication_data_ref`` of Ascend op_mapping.yaml
  files points there); NCCL and gloo directories keep their names.  Where both exist the upgrade
  stops before changing anything: merging two measurements is a person's decision.
* In ``hcom_{op}_.csv`` rows this project wrote with nccl-tests' sizes (a ``backend`` cell, no
  ``nccl_tests_bytes``), all_gather and reduce_scatter get ``message_bytes`` divided by the group
  size and ``bandwidth_gbps`` recomputed from it and ``Duration(us)``; ``bus_bandwidth_gbps`` was
  computed from nccl-tests' size and stays.
* Every row gets ``nccl_tests_bytes`` (the column is appended when missing), rows of the Ascend
  microbenchmark too, whose ``message_bytes`` already is the reader's.
* ``dtype`` cells with a known but older spelling (``DT_FLOAT16``, ``FLOAT``, ``INT8``, ``BF16``)
  get the Ascend microbenchmark's (``DT_FP16``, ``DT_FLOAT``, ``DT_INT8``, ``DT_BF16``).

Files whose name is not one of the four this project writes are left alone and listed.  Running
the upgrade again finds nothing to do.  Each directory is rewritten under its database lock, each
file replaced atomically; a file is planned again under the lock, so a run writing into it
meanwhile loses nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.comm.collectives import Collective, dtype_by_db_name, op_for_file_name
from perf_plugin.comm.record import (
    BACKEND,
    BANDWIDTH,
    DTYPE,
    DURATION,
    MESSAGE_BYTES,
    NCCL_TESTS_BYTES,
    NUM_DEVICES,
    bandwidth_cell,
)
from perf_plugin.comm.writer import legacy_cells, parse_int
from perf_plugin.database.atomic import atomic_write_bytes
from perf_plugin.database.cell_edit import CellEditor
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.file_kind import EmptyFile, decode_csv_bytes
from perf_plugin.database.lock import database_lock
from perf_plugin.database.paths import ASCEND_CCL, comm_version_dir
from perf_plugin.database.schema import parse_duration

FILE_PATTERN = "hcom_*.csv"


@dataclass(frozen=True)
class FileChange:
    """The new text of one collective CSV and what changed in it."""

    path: Path
    text: str
    sizes: int  # rows whose message_bytes became the reader's
    dtypes: int  # dtype cells respelled
    filled: int  # nccl_tests_bytes cells filled
    column_added: bool

    def summary(self) -> str:
        parts = []
        if self.sizes:
            parts.append(f"{self.sizes} row{'s' if self.sizes != 1 else ''} to the reader's message_bytes")
        if self.dtypes:
            parts.append(f"{self.dtypes} dtype cell{'s' if self.dtypes != 1 else ''} respelled")
        if self.filled:
            added = "column added, " if self.column_added else ""
            parts.append(f"nccl_tests_bytes {added}{self.filled} cell{'s' if self.filled != 1 else ''} filled")
        return "; ".join(parts)


@dataclass(frozen=True)
class DirectoryPlan:
    """One directory of collective CSVs: the files to rewrite and where the directory goes."""

    directory: Path
    target: Path  # the directory itself when it keeps its name
    changes: tuple[FileChange, ...]
    foreign: tuple[Path, ...]  # hcom_*.csv files this project does not write

    @property
    def moves(self) -> bool:
        return self.target != self.directory

    @property
    def needed(self) -> bool:
        return self.moves or bool(self.changes)


@dataclass(frozen=True)
class UpgradePlan:
    root: Path
    directories: tuple[DirectoryPlan, ...]

    @property
    def needed(self) -> bool:
        return any(d.needed for d in self.directories)


class _FilePlanner:
    """The cell changes of one file, row by row."""

    def __init__(self, path: Path, op: Collective, text: str) -> None:
        self.path, self.op = path, op
        self.editor = CellEditor(text)
        self.header = self.editor.values(0) if self.editor.records else []
        self.width = len(self.header)  # before nccl_tests_bytes is appended
        self.sizes = self.dtypes = self.filled = 0

    def _error(self, reason: str, record: int, column: str) -> DatabaseError:
        return DatabaseError(reason, path=self.path, row=self.editor.records[record].line, column=column)

    def _int(self, cells: dict[str, str], record: int, column: str) -> int | None:
        try:
            return parse_int(cells.get(column, ""))
        except ValueError as exc:
            raise self._error(str(exc), record, column) from None

    def _set(self, record: int, column: str, value: str) -> None:
        self.editor.set(record, self.header.index(column), value)

    def _respell_dtype(self, cells: dict[str, str], record: int) -> None:
        dtype = dtype_by_db_name(cells.get(DTYPE, ""))
        if dtype is not None and cells[DTYPE] != dtype.db_name:
            self._set(record, DTYPE, dtype.db_name)
            self.dtypes += 1

    def _reader_size(self, cells: dict[str, str], record: int, size: int, n: int) -> int:
        """``message_bytes`` as the reader counts it, rewriting a legacy row's size cells."""
        if not legacy_cells(cells.get(BACKEND, ""), cells.get(NCCL_TESTS_BYTES, "")) or not self.op.rank_chunk:
            return size
        try:
            reader_size = self.op.message_bytes(size, n)
        except ValueError as exc:
            raise self._error(str(exc), record, MESSAGE_BYTES) from None
        self._set(record, MESSAGE_BYTES, str(reader_size))
        self.sizes += 1
        if cells.get(BANDWIDTH, "").strip():
            duration = parse_duration(cells.get(DURATION, ""))
            if duration is None or duration <= 0:
                raise self._error("no positive duration to recompute bandwidth_gbps from", record, DURATION)
            self._set(record, BANDWIDTH, bandwidth_cell(reader_size, duration))
        return reader_size

    def _row(self, record: int) -> None:
        values = self.editor.values(record)
        if len(values) > self.width:
            raise self._error(f"{len(values)} cells for {self.width} columns", record, self.header[self.width - 1])
        cells = dict(zip(self.header, values))
        self._respell_dtype(cells, record)
        size, n = self._int(cells, record, MESSAGE_BYTES), self._int(cells, record, NUM_DEVICES)
        if size is None or n is None:
            return  # nothing to convert or state without both sizes
        if n < 1:
            raise self._error(f"{n} is not a group size", record, NUM_DEVICES)
        reader_size = self._reader_size(cells, record, size, n)
        if not cells.get(NCCL_TESTS_BYTES, "").strip():
            self._set(record, NCCL_TESTS_BYTES, str(self.op.nccl_tests_bytes(reader_size, n)))
            self.filled += 1

    def plan(self) -> FileChange | None:
        if not self.header:
            return None
        for column in (MESSAGE_BYTES, NUM_DEVICES):
            if column not in self.header:
                raise DatabaseError("missing column", path=self.path, column=column)
        column_added = NCCL_TESTS_BYTES not in self.header
        if column_added:
            self.header.append(NCCL_TESTS_BYTES)
            self.editor.set(0, len(self.header) - 1, NCCL_TESTS_BYTES)
        for record in range(1, len(self.editor.records)):
            if not self.editor.is_blank(record):
                self._row(record)
        if not self.editor.changed:
            return None
        return FileChange(self.path, self.editor.render(), self.sizes, self.dtypes, self.filled, column_added)


def read_text(path: Path) -> str | None:
    """The file's text; None for an empty file (nothing to upgrade).  A Git LFS pointer or a
    binary file is refused by name, as every reader of the database refuses it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatabaseError(f"cannot read file: {exc.strerror}", path=path) from None
    try:
        return decode_csv_bytes(data, path)
    except EmptyFile:
        return None


def plan_file(path: Path) -> FileChange | None:
    """The upgrade of one ``hcom_{op}_.csv`` (None when it has nothing to change)."""
    op = op_for_file_name(path.name)
    if op is None:
        raise DatabaseError("not a collective file this project writes (hcom_{op}_.csv)", path=path)
    text = read_text(path)
    return None if text is None else _FilePlanner(path, op, text).plan()


def _target(directory: Path) -> Path:
    if directory.parent.name != ASCEND_CCL:
        return directory
    return directory.parent / comm_version_dir(ASCEND_CCL, directory.name)


def plan_directory(directory: Path) -> DirectoryPlan:
    changes: list[FileChange] = []
    foreign: list[Path] = []
    for path in sorted(directory.glob(FILE_PATTERN)):
        if op_for_file_name(path.name) is None:
            foreign.append(path)
            continue
        change = plan_file(path)
        if change is not None:
            changes.append(change)
    target = _target(directory)
    if target != directory and target.exists():
        raise DatabaseError(
            f"{target.name} exists beside it: move the files of one into the other "
            "(perfdb validate-comm compares them), then run the upgrade again",
            path=directory,
        )
    return DirectoryPlan(directory, target, tuple(changes), tuple(foreign))


def plan_upgrade(root: str | Path) -> UpgradePlan:
    """Every directory under ``root`` (``root`` included) that holds ``hcom_*.csv`` files."""
    root = Path(root)
    if not root.is_dir():
        raise DatabaseError("no such directory", path=root)
    directories = sorted({path.parent for path in root.rglob(FILE_PATTERN) if path.is_file()})
    return UpgradePlan(root, tuple(plan_directory(d) for d in directories))


def apply_directory(plan: DirectoryPlan, lock_timeout_s: float = 60.0) -> None:
    """Rewrite the directory's files (planned again under its lock), then rename it."""
    with database_lock(plan.directory, lock_timeout_s):
        for path in sorted(plan.directory.glob(FILE_PATTERN)):
            fresh = plan_file(path) if op_for_file_name(path.name) else None
            if fresh is not None:
                atomic_write_bytes(fresh.path, fresh.text.encode("utf-8"))
    if plan.moves:
        # renamed after the lock is released: the lock file moves with the directory
        os.rename(plan.directory, plan.target)


def apply_upgrade(plan: UpgradePlan, lock_timeout_s: float = 60.0) -> None:
    # deepest first, so a directory renamed later carries the ones inside it already upgraded
    for directory in reversed(plan.directories):
        if directory.needed:
            apply_directory(directory, lock_timeout_s)
