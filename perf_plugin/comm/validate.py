"""Alignment of two collective databases: which measurements deviate beyond a threshold.

Rows are matched per ``(op, message_bytes, num_devices, topology_tier, dtype, mode)``; a key
column that either side lacks (older files have no ``mode``, some no ``dtype`` or
``topology_tier``) is left out of the key, and ``op`` comes from the file name
(``hcom_allReduce_.csv``) when directories are compared.  A row's duration is the first valid
one of ``Average Duration(us)``, ``Profiling Average Duration(us)``, ``Duration(us)`` (the order a
simulator reads them).  The deviation is ``candidate / baseline - 1``; a pair is flagged when its
absolute deviation exceeds the threshold.

Sizes are compared as the Ascend reader counts them (``message_bytes``, see ``collectives``), and
dtype spellings are normalised (``DT_FLOAT16`` and ``DT_FP16`` are one key).  Rows written by this
project before ``message_bytes`` followed the reader (``backend`` set, no ``nccl_tests_bytes``)
are converted as they are read, so a database not yet upgraded still pairs the right sizes; that
needs the op, so such a file must be named ``hcom_{op}_.csv``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.comm.collectives import COLLECTIVES, op_for_file_name
from perf_plugin.comm.record import COLUMNS, DTYPE, MESSAGE_BYTES, MODE, NUM_DEVICES, TOPOLOGY_TIER
from perf_plugin.comm.writer import is_legacy_row, row_key
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.file_kind import require_known_column
from perf_plugin.database.schema import DURATION_PREFERENCE, preferred_duration
from perf_plugin.database.table import CsvTable

OPTIONAL_KEY_COLUMNS = (TOPOLOGY_TIER, DTYPE, MODE)


@dataclass(frozen=True)
class CommTable:
    """The rows of one collective CSV, keyed for matching."""

    op: str
    path: Path
    columns: frozenset[str]
    rows: tuple[tuple[tuple[object, ...], float, int], ...]  # (full key, duration us, line)
    skipped: int  # rows without a valid duration


@dataclass(frozen=True)
class Pair:
    op: str
    key: tuple[tuple[str, object], ...]  # (column, value) of the columns both sides have
    baseline_us: float
    candidate_us: float

    @property
    def deviation(self) -> float:
        return self.candidate_us / self.baseline_us - 1.0


@dataclass(frozen=True)
class Comparison:
    threshold: float
    pairs: tuple[Pair, ...]
    only_baseline: int
    only_candidate: int
    skipped: int

    @property
    def flagged(self) -> tuple[Pair, ...]:
        return tuple(p for p in self.pairs if abs(p.deviation) > self.threshold)


def _duration(table: CsvTable, row: int) -> float | None:
    return preferred_duration(table.row_dict(row))[0]


def _reader_key(table: CsvTable, row: int, path: Path, op: str) -> tuple[object, ...]:
    """The row's key with ``message_bytes`` as the Ascend reader counts it."""
    key = row_key(table, row, path)
    if not is_legacy_row(table, row):
        return key
    if op not in COLLECTIVES:
        raise DatabaseError(
            "written with nccl-tests' message_bytes, whose op the file name does not say "
            "(name it hcom_{op}_.csv, or run perfdb upgrade-comm on its directory)",
            path=path,
            row=table.line_of(row),
            column=MESSAGE_BYTES,
        )
    message_bytes, num_devices = key[0], key[1]
    if not isinstance(message_bytes, int) or not isinstance(num_devices, int):
        return key  # an empty size cell: nothing to convert
    try:
        converted = COLLECTIVES[op].message_bytes(message_bytes, num_devices)
    except ValueError as exc:
        raise DatabaseError(str(exc), path=path, row=table.line_of(row), column=MESSAGE_BYTES) from None
    return (converted, *key[1:])


def load_table(path: Path, op: str) -> CommTable:
    table = CsvTable.read(path)
    require_known_column(table.header, COLUMNS, path, "collective CSV")
    for column in (MESSAGE_BYTES, NUM_DEVICES):
        table.index(column)
    if not any(table.has_column(c) for c in DURATION_PREFERENCE):
        raise DatabaseError(f"no duration column (one of {', '.join(DURATION_PREFERENCE)})", path=path)
    rows, skipped = [], 0
    for row in range(len(table)):
        if table.is_blank(row):
            continue
        duration = _duration(table, row)
        if duration is None:
            skipped += 1
            continue
        rows.append((_reader_key(table, row, path, op), duration, table.line_of(row) or row + 2))
    return CommTable(op, path, frozenset(table.header), tuple(rows), skipped)


def load_tables(path: str | Path) -> dict[str, CommTable]:
    """A file (op from its name, or '' when the name is not an hcom file) or a directory of them."""
    path = Path(path)
    if path.is_dir():
        tables = {}
        for csv_path in sorted(path.glob("hcom_*.csv")):
            op = op_for_file_name(csv_path.name)
            tables[op.name if op else csv_path.stem] = load_table(csv_path, op.name if op else csv_path.stem)
        if not tables:
            raise DatabaseError("no hcom_*.csv files in this directory", path=path)
        return tables
    if not path.exists():
        raise DatabaseError("no such file or directory", path=path)
    op = op_for_file_name(path.name)
    return {"": load_table(path, op.name if op else "")}


KEY_ORDER = (MESSAGE_BYTES, NUM_DEVICES, DTYPE, TOPOLOGY_TIER, MODE)  # the order of writer.row_key


def _index(table: CommTable, names: Iterable[str]) -> dict[tuple[object, ...], tuple[float, int]]:
    positions = [KEY_ORDER.index(name) for name in names]
    index: dict[tuple[object, ...], tuple[float, int]] = {}
    for full_key, duration, line in table.rows:
        key = tuple(full_key[i] for i in positions)
        if key in index:
            raise DatabaseError(
                f"rows {index[key][1]} and {line} have the same key "
                f"({', '.join(f'{n}={v}' for n, v in zip(names, key))})",
                path=table.path,
            )
        index[key] = (duration, line)
    return index


def compare_tables(baseline: CommTable, candidate: CommTable, op: str) -> tuple[list[Pair], int, int]:
    names = [MESSAGE_BYTES, NUM_DEVICES] + [
        c for c in OPTIONAL_KEY_COLUMNS if c in baseline.columns and c in candidate.columns
    ]
    names.sort(key=KEY_ORDER.index)
    base, cand = _index(baseline, names), _index(candidate, names)
    pairs = [
        Pair(op, tuple(zip(names, key)), base[key][0], cand[key][0]) for key in base if key in cand
    ]
    return pairs, len(base.keys() - cand.keys()), len(cand.keys() - base.keys())


def compare_paths(baseline: str | Path, candidate: str | Path, threshold: float) -> Comparison:
    if threshold < 0:
        raise DatabaseError(f"threshold {threshold} is negative")
    base_tables, cand_tables = load_tables(baseline), load_tables(candidate)
    if "" in base_tables or "" in cand_tables:
        # a single file on either side: compare it with the other side's single file
        if len(base_tables) != 1 or len(cand_tables) != 1:
            raise DatabaseError("compare a file with a file, or a directory with a directory")
        (b,), (c,) = base_tables.values(), cand_tables.values()
        base_tables, cand_tables = {b.op or c.op: b}, {b.op or c.op: c}
    pairs: list[Pair] = []
    only_base = only_cand = 0
    for op in sorted(base_tables.keys() | cand_tables.keys()):
        if op not in cand_tables:
            only_base += len(base_tables[op].rows)
            continue
        if op not in base_tables:
            only_cand += len(cand_tables[op].rows)
            continue
        found, b_only, c_only = compare_tables(base_tables[op], cand_tables[op], op)
        pairs.extend(found)
        only_base += b_only
        only_cand += c_only
    skipped = sum(t.skipped for t in base_tables.values()) + sum(t.skipped for t in cand_tables.values())
    return Comparison(threshold, tuple(pairs), only_base, only_cand, skipped)
