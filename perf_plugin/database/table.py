"""A CSV table that round-trips byte for byte and changes only what it is told to change.

Database CSVs are shared with other tools and reviewed in diffs, so reading and writing a file
with no change must give back the same bytes (column order, row order, quoting, number
formatting, line endings, byte-order mark).  The table keeps each record's raw text and
re-serialises only records whose cells changed; re-serialisation uses minimal quoting, which is
what real profiler files and hand-written databases use, so even changed rows keep the file's
look (a shape value ``"4096,1024"`` with embedded quotes is written back as ``\"\"\"4096,1024\"\"\"``).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perf_plugin.database.atomic import atomic_write_text_chunks
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.file_kind import decode_csv_bytes

_LINE_BREAK = re.compile(r"\r\n|\n|\r")
_BOM = "\ufeff"


def _split_records(text: str) -> Iterator[tuple[str, int]]:
    """Yield (raw record text including its terminator, 1-based first line number).

    A record ends at a line break outside quotes; a quoted cell may hold line breaks.
    """
    start = 0
    line_no = 1
    record_start = 0
    record_line = 1
    quotes = 0
    for match in _LINE_BREAK.finditer(text):
        quotes += text.count('"', start, match.start())
        start = match.end()
        line_no += 1
        if quotes % 2 == 0:
            yield text[record_start:start], record_line
            record_start = start
            record_line = line_no
            quotes = 0
        else:
            quotes += 0
    if record_start < len(text):
        yield text[record_start:], record_line


def _strip_terminator(record: str) -> str:
    """A record's text without the one line break that ends it."""
    for terminator in ("\r\n", "\n", "\r"):
        if record.endswith(terminator):
            return record[: -len(terminator)]
    return record


def _detect_newline(text: str) -> str:
    match = _LINE_BREAK.search(text)
    return match.group(0) if match else "\n"


@dataclass
class CsvTable:
    """Header and rows of one CSV file, with the raw text of every unchanged record."""

    header: list[str]
    rows: list[list[str]]
    path: Path | None = None
    newline: str = "\n"
    bom: bool = False
    trailing_newline: bool = True
    row_lines: list[int | None] = field(default_factory=list)  # None: a row added since
    _raw_header: str | None = None
    _raw_rows: list[str | None] = field(default_factory=list)
    _rows_removed: bool = False

    # ----------------------------------------------------------------------------- reading
    @classmethod
    def read(cls, path: str | Path) -> "CsvTable":
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise DatabaseError(f"cannot read file: {exc.strerror}", path=path) from None
        # a Git LFS pointer, an empty or a binary file: refused by name, before any parsing
        text = decode_csv_bytes(data, path)
        table = cls.parse(text)
        table.path = path
        return table

    @classmethod
    def parse(cls, text: str) -> "CsvTable":
        bom = text.startswith(_BOM)
        if bom:
            text = text[1:]
        newline = _detect_newline(text)
        trailing_newline = text.endswith(("\n", "\r"))
        records = list(_split_records(text))
        if not records:
            return cls(header=[], rows=[], newline=newline, bom=bom, trailing_newline=True)
        parsed: list[list[str]] = []
        # One object per distinct cell text: a database repeats most of its cells (dtypes,
        # formats, core, backend, timestamp; every identity cell of a grid's shared weights),
        # and the cells outlive the parse in each collected case; 100,000 rows of one shape
        # held 134 MiB as parsed, 48 MiB with the cells shared (parsing took 7 % longer).
        shared: dict[str, str] = {}
        for raw, _line in records:
            cells = next(csv.reader([raw.rstrip("\r\n")]), []) if raw.strip("\r\n") else []
            if "\n" in raw.rstrip("\r\n") or "\r" in raw.rstrip("\r\n"):
                # a quoted cell spans lines: let the csv module read the whole record
                cells = next(csv.reader(io.StringIO(raw, newline="")), [])
            parsed.append([shared.setdefault(cell, cell) for cell in cells])
        header_raw, _ = records[0]
        table = cls(
            header=parsed[0],
            rows=parsed[1:],
            newline=newline,
            bom=bom,
            trailing_newline=trailing_newline,
            row_lines=[line for _, line in records[1:]],
            _raw_header=header_raw,
            _raw_rows=[raw for raw, _ in records[1:]],
        )
        return table

    @classmethod
    def new(cls, header: Sequence[str], newline: str = "\n") -> "CsvTable":
        return cls(header=list(header), rows=[], newline=newline)

    # ----------------------------------------------------------------------------- access
    def __len__(self) -> int:
        return len(self.rows)

    def has_column(self, name: str) -> bool:
        return name in self.header

    def index(self, name: str) -> int:
        try:
            return self.header.index(name)
        except ValueError:
            raise DatabaseError("missing column", path=self.path, column=name) from None

    def get(self, row: int, name: str, default: str = "") -> str:
        if name not in self.header:
            return default
        cells = self.rows[row]
        position = self.header.index(name)
        return cells[position] if position < len(cells) else default

    def row_dict(self, row: int) -> dict[str, str]:
        cells = self.rows[row]
        return {name: (cells[i] if i < len(cells) else "") for i, name in enumerate(self.header)}

    def is_blank(self, row: int) -> bool:
        return all(cell.strip() == "" for cell in self.rows[row])

    def line_of(self, row: int) -> int | None:
        """The 1-based line number of a row in the file it was read from (None if added since)."""
        return self.row_lines[row] if row < len(self.row_lines) else None

    def lines_in(self, row: int | None) -> int:
        """How many lines the row's record (the header's, for None) takes when written now: more
        than one where a quoted cell holds line breaks."""
        if row is None:
            raw, cells = self._raw_header, self.header
        else:
            raw, cells = self._raw_rows[row], self.rows[row]
        text = raw if raw is not None else self._serialise(cells)
        return 1 + len(_LINE_BREAK.findall(_strip_terminator(text)))

    # ----------------------------------------------------------------------------- changes
    def _pad(self, row: int) -> list[str]:
        cells = self.rows[row]
        if len(cells) < len(self.header):
            cells.extend([""] * (len(self.header) - len(cells)))
        return cells

    def set(self, row: int, name: str, value: str) -> bool:
        """Set one cell; returns True if the value changed."""
        position = self.index(name)
        if self.get(row, name) == value and position < len(self.rows[row]):
            return False
        cells = self._pad(row)
        cells[position] = value
        self._raw_rows[row] = None
        return True

    def insert_column(self, name: str, position: int | None = None) -> None:
        """Add an empty column at ``position`` (end by default); every record is rewritten."""
        if name in self.header:
            return
        if position is None or position > len(self.header):
            position = len(self.header)
        for i in range(len(self.rows)):
            if self.is_blank(i) and not self.rows[i]:
                continue
            self._pad(i).insert(position, "")
        self.header.insert(position, name)
        self._raw_header = None
        self._raw_rows = [None if cells else raw for cells, raw in zip(self.rows, self._raw_rows)]

    def append_row(self, values: Mapping[str, str]) -> int:
        unknown = [name for name in values if name not in self.header]
        for name in unknown:
            self.insert_column(name)
        self.rows.append([values.get(name, "") for name in self.header])
        self._raw_rows.append(None)
        return len(self.rows) - 1

    def insert_row(self, position: int, values: Mapping[str, str]) -> int:
        """Add a row before row ``position`` (at the end, past the last); the rows after it keep
        their raw text and the lines they were read from."""
        position = min(max(position, 0), len(self.rows))
        unknown = [name for name in values if name not in self.header]
        for name in unknown:
            self.insert_column(name)
        self.rows.insert(position, [values.get(name, "") for name in self.header])
        self._raw_rows.insert(position, None)
        if position <= len(self.row_lines):
            self.row_lines.insert(position, None)
        return position

    def delete_rows(self, indices: Iterable[int]) -> None:
        doomed = set(indices)
        if doomed:
            self._rows_removed = True
        keep = [i for i in range(len(self.rows)) if i not in doomed]
        self.rows = [self.rows[i] for i in keep]
        self._raw_rows = [self._raw_rows[i] for i in keep]
        self.row_lines = [self.row_lines[i] for i in keep if i < len(self.row_lines)]

    @property
    def changed(self) -> bool:
        return self._rows_removed or self._raw_header is None or any(raw is None for raw in self._raw_rows)

    # ----------------------------------------------------------------------------- writing
    def _serialise(self, cells: Sequence[str]) -> str:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator=self.newline, quoting=csv.QUOTE_MINIMAL).writerow(cells)
        return buffer.getvalue()

    def iter_text(self) -> Iterator[str]:
        """The file's text a record at a time: unchanged records as read, changed ones serialised."""
        previous: str | None = None  # held back: the last piece may lose its newline
        for piece in self._records_text():
            if previous is not None:
                yield previous
            previous = piece
        if previous is None:
            return
        if not self.trailing_newline and previous.endswith(self.newline):
            previous = previous[: -len(self.newline)]
        yield previous

    def _records_text(self) -> Iterator[str]:
        if self.bom:
            yield _BOM
        yield self._raw_header if self._raw_header is not None else self._serialise(self.header)
        for cells, raw in zip(self.rows, self._raw_rows):
            if raw is not None and not raw.endswith(("\n", "\r")):
                raw = raw + self.newline  # a record that used to be last gained a successor
            yield raw if raw is not None else self._serialise(cells)

    def to_text(self) -> str:
        return "".join(self.iter_text())

    def write(self, path: str | Path | None = None) -> Path:
        """Write atomically (temporary file + rename) to ``path`` or the file it was read from."""
        target = Path(path) if path is not None else self.path
        if target is None:
            raise DatabaseError("table has no path to write to")
        # streamed: a 100,000-row file is never held whole, as text and again as bytes
        atomic_write_text_chunks(target, self.iter_text())
        self.path = target
        return target
