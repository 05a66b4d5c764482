"""Write aggregated rows into a database directory, merging with what is already there.

For each kernel type, ``{KernelType}.csv`` is created or updated under the database lock:

* a row whose signature (``perf_plugin.database.signature.row_signature``) matches an existing
  row updates that row's profiling columns (``Profiling Average/Median/Std Duration(us)``, the
  ``Profiling Average <counter>`` columns of this profile, ``Profiling Count``);
* a new signature is appended (identity cells for the identity columns the file has);
* microbench columns (``Average Duration(us)``, ``MicroBench ...``), identity cells of existing
  rows, profiling counters this profile does not have, and unknown columns are never touched.

When several rows share a signature (the MatMul family compares operands in a canonical
transposition, so ``a,b;b,c`` and ``a,b;c,b`` are one signature), a row whose cells are exactly
the profile's is preferred, and each existing row is claimed by at most one profiled row.
Ingesting the same profile twice therefore changes nothing, and an unchanged file is not
rewritten at all.  All files are merged in memory before the first is written, so a file that
cannot be merged stops the ingest with nothing changed; every write is atomic
(``CsvTable.write``).

A FusedInferAttentionScore row's ``Runtime ...`` cells from the FIA bundle check
(``perf_plugin.ingest.fia_bundle``) are written with it, in columns added at the end; an existing
row whose ``Runtime metadata_completeness`` says a serving run's values are there keeps them.

New columns go where the schema puts them: the profiling duration columns after
``Average Duration(us)`` (or after the identity columns), ``Profiling Average <counter>``
after its ``MicroBench <counter>`` (or after the last profiling column), ``Profiling Count`` at the
end.  Shape cells follow the file's quoting: a file whose shapes are plain (``4096,1024``) gets
plain cells, a profiler-style file gets the embedded-quote form.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.kernel_types import validate_kernel_type
from perf_plugin.database.lock import database_lock
from perf_plugin.database.schema import (
    DETAIL_COLUMNS,
    IDENTITY_COLUMNS,
    INPUT_STRIDES,
    MICROBENCH_AVERAGE,
    PROFILING_COUNT,
    PROFILING_COUNTER_PREFIX,
    PROFILING_DURATION_COLUMNS,
    SIGNATURE_COLUMNS,
    microbench_counter_column,
)
from perf_plugin.database.shapes import (
    QuoteStyle,
    detect_quote_style,
    strip_embedded_quotes,
)
from perf_plugin.database.signature import Signature
from perf_plugin.database.table import CsvTable
from perf_plugin.ingest.aggregate import TEXT_CELLS, AggregatedRow
from perf_plugin.ingest.fia_bundle import PROFILE_TAG
from perf_plugin.ingest.fia_runtime import COMPLETENESS
from perf_plugin.replay.registry import signature_of

SHAPE_COLUMNS: tuple[str, ...] = ("Input Shapes", "Output Shapes")


@dataclass
class FileChange:
    kernel_type: str
    path: Path
    created: bool = False
    rewritten: bool = False
    updated: int = 0
    unchanged: int = 0
    appended: int = 0


@dataclass
class MergeResult:
    directory: Path
    files: list[FileChange] = field(default_factory=list)

    @property
    def rows_appended(self) -> int:
        return sum(f.appended for f in self.files)

    @property
    def rows_updated(self) -> int:
        return sum(f.updated for f in self.files)


def new_table_header(rows: Sequence[AggregatedRow]) -> list[str]:
    counters = list(dict.fromkeys(c for row in rows for c in row.counters))
    return [
        *IDENTITY_COLUMNS,
        *PROFILING_DURATION_COLUMNS,
        *(PROFILING_COUNTER_PREFIX + c for c in counters),
        PROFILING_COUNT,
        *_optional_columns(rows),
        *_details_of(rows),
        *_runtime_of(rows),
    ]


# The optional profiling columns after ``Profiling Count``, in header order, and what says a row
# has a cell for each.
_OPTIONAL_AFTER_COUNT: tuple[tuple[str, Callable[[AggregatedRow], str]], ...] = tuple(
    (column, operator.attrgetter(name)) for column, name in TEXT_CELLS
)


def _optional_columns(rows: Sequence[AggregatedRow]) -> list[str]:
    """The optional columns after ``Profiling Count`` some row has a cell for, in header order."""
    return [name for name, cell in _OPTIONAL_AFTER_COUNT if any(cell(row) for row in rows)]


def _details_of(rows: Sequence[AggregatedRow]) -> list[str]:
    """The detail columns (strides, aten arguments) some row has a value for, in schema order."""
    return [name for name in DETAIL_COLUMNS if any(row.cells.get(name) for row in rows)]


def _runtime_of(rows: Sequence[AggregatedRow]) -> list[str]:
    """The Runtime columns some row carries (the FIA bundle check's), in the order it gives them."""
    return list(dict.fromkeys(name for row in rows for name in row.runtime))


def _merge_runtime(table: CsvTable, index: int, runtime: Mapping[str, str]) -> bool:
    """Fill a row's Runtime cells from the profile, unless a serving run's values are there
    (``perfdb fia-runtime`` set its completeness): those say more than the profile can."""
    if table.get(index, COMPLETENESS).strip() not in ("", PROFILE_TAG):
        return False
    changed = False
    for name, value in runtime.items():
        if value:
            changed |= table.set(index, name, value)
    return changed


def _ensure_profiling_columns(table: CsvTable, rows: Sequence[AggregatedRow]) -> None:
    for i, name in enumerate(PROFILING_DURATION_COLUMNS):
        if table.has_column(name):
            continue
        if i > 0 and table.has_column(PROFILING_DURATION_COLUMNS[i - 1]):
            position = table.index(PROFILING_DURATION_COLUMNS[i - 1]) + 1
        elif table.has_column(MICROBENCH_AVERAGE):
            position = table.index(MICROBENCH_AVERAGE) + 1
        else:
            position = _after_identity(table)
        table.insert_column(name, position)
    for counter in dict.fromkeys(c for row in rows for c in row.counters):
        name = PROFILING_COUNTER_PREFIX + counter
        if table.has_column(name):
            continue
        microbench = microbench_counter_column(counter)
        if table.has_column(microbench):
            position = table.index(microbench) + 1
        else:
            position = _after_last_profiling(table)
        table.insert_column(name, position)
    if not table.has_column(PROFILING_COUNT):
        table.insert_column(PROFILING_COUNT)
    wanted = set(_optional_columns(rows))
    earlier = [PROFILING_COUNT]
    for name, _ in _OPTIONAL_AFTER_COUNT:  # each right after the nearest earlier one the file has
        if name in wanted and not table.has_column(name):
            anchor = next(column for column in reversed(earlier) if table.has_column(column))
            table.insert_column(name, table.index(anchor) + 1)
        earlier.append(name)


def _after_identity(table: CsvTable) -> int:
    return max((table.index(c) for c in IDENTITY_COLUMNS if table.has_column(c)), default=-1) + 1


def _after_last_profiling(table: CsvTable) -> int:
    positions = [
        i
        for i, name in enumerate(table.header)
        if name.startswith(PROFILING_COUNTER_PREFIX) or name in PROFILING_DURATION_COLUMNS
    ]
    return (max(positions) + 1) if positions else len(table.header)


def _styled(cells: dict[str, str], style: QuoteStyle) -> dict[str, str]:
    styled = dict(cells)
    for name in (*SHAPE_COLUMNS, INPUT_STRIDES):
        value = styled.get(name, "")
        inner = strip_embedded_quotes(value)
        if value.strip() == "N/A" or inner == "":
            continue  # no shape to quote: keep the cell as the source wrote it
        styled[name] = f'"{inner}"' if style is QuoteStyle.EMBEDDED else inner
    return styled


def cells_key(cells: Mapping[str, str]) -> tuple[str, ...]:
    """A row's signature and detail cells, spelled alike however the file quotes and spaces them."""
    columns = (*SIGNATURE_COLUMNS, *DETAIL_COLUMNS)
    return tuple(strip_embedded_quotes(cells.get(c, "")).replace(" ", "") for c in columns)


class _RowIndex:
    """Existing rows by signature, remembering which ones this ingest already claimed."""

    def __init__(self, table: CsvTable, kernel_type: str) -> None:
        self.kernel_type = kernel_type
        self.by_signature: dict[Signature, list[int]] = defaultdict(list)
        self.claimed: set[int] = set()
        self.keys: dict[int, tuple[str, ...]] = {}
        for i in range(len(table)):
            if table.is_blank(i):
                continue
            self.add(i, table.row_dict(i))

    def add(self, index: int, cells: dict[str, str]) -> None:
        self.by_signature[signature_of(self.kernel_type, cells)].append(index)
        self.keys[index] = cells_key(cells)

    def claim(self, cells: dict[str, str]) -> int | None:
        signature = signature_of(self.kernel_type, cells)
        candidates = [i for i in self.by_signature.get(signature, []) if i not in self.claimed]
        if not candidates:
            return None
        key = cells_key(cells)
        exact = [i for i in candidates if self.keys[i] == key]
        chosen = (exact or candidates)[0]
        self.claimed.add(chosen)
        return chosen


def _read_or_create(path: Path, rows: Sequence[AggregatedRow]) -> tuple[CsvTable, bool]:
    if path.exists():
        table = CsvTable.read(path)
        missing = [c for c in SIGNATURE_COLUMNS if not table.has_column(c)]
        if missing:
            raise DatabaseError(
                f"cannot merge into this file: it has no {', '.join(repr(m) for m in missing)} column(s)",
                path=path,
            )
        return table, False
    table = CsvTable.new(new_table_header(rows))
    table.path = path
    return table, True


def merge_kernel_type(table: CsvTable, kernel_type: str, rows: Sequence[AggregatedRow], change: FileChange) -> None:
    existing_shapes = [table.get(i, c) for i in range(len(table)) for c in SHAPE_COLUMNS]
    style = detect_quote_style(existing_shapes) if len(table) else None
    _ensure_profiling_columns(table, rows)
    for name in (*_details_of(rows), *_runtime_of(rows)):
        if not table.has_column(name):
            table.insert_column(name)  # at the end: a column this project adds
    index = _RowIndex(table, kernel_type)
    for row in rows:
        cells = dict(row.cells)
        target = index.claim(cells)
        values = row.profiling_values()
        if target is None:
            appended_cells = _styled(cells, style) if style is not None else cells
            # identity columns the file does not have (a hand-written database without
            # ``OP State``) are not added to it: its layout is its owner's
            appended_cells = {k: v for k, v in appended_cells.items() if table.has_column(k)}
            position = table.append_row({**appended_cells, **values, **row.runtime})
            index.add(position, appended_cells)
            index.claimed.add(position)
            change.appended += 1
            continue
        changed = False
        for name, value in values.items():
            changed |= table.set(target, name, value)
        changed |= _merge_runtime(table, target, row.runtime)
        if changed:
            change.updated += 1
        else:
            change.unchanged += 1


def group_by_type(rows: Iterable[AggregatedRow]) -> dict[str, list[AggregatedRow]]:
    grouped: dict[str, list[AggregatedRow]] = {}
    for row in rows:
        grouped.setdefault(row.kernel_type, []).append(row)
    return grouped


def validate_types(grouped: dict[str, list[AggregatedRow]], source: str | Path | None = None) -> None:
    """Check every kernel type before anything is written: one bad name aborts the whole ingest."""
    for kernel_type in grouped:
        try:
            validate_kernel_type(kernel_type)
        except DatabaseError as exc:
            raise exc.located(path=source, column="Type") from None


def merge_into_database(directory: str | Path, rows: Iterable[AggregatedRow]) -> MergeResult:
    directory = Path(directory)
    grouped = group_by_type(rows)
    validate_types(grouped)
    result = MergeResult(directory)
    if directory.exists() and not directory.is_dir():
        raise DatabaseError("the database path is a file, not a directory", path=directory)
    directory.mkdir(parents=True, exist_ok=True)
    with database_lock(directory):
        # Merge every file in memory first: a file that cannot be merged stops the ingest
        # before anything is written.
        pending: list[tuple[CsvTable, FileChange]] = []
        for kernel_type, type_rows in grouped.items():
            path = directory / f"{kernel_type}.csv"
            table, created = _read_or_create(path, type_rows)
            change = FileChange(kernel_type, path, created=created)
            merge_kernel_type(table, kernel_type, type_rows, change)
            pending.append((table, change))
        for table, change in pending:
            if change.created or table.changed:
                table.write(change.path)
                change.rewritten = True
            result.files.append(change)
    return result
