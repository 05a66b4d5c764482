"""Change single cells of a CSV text and leave every other byte as it was.

``CsvTable`` keeps unchanged *records* byte for byte and writes a changed record again with
minimal quoting.  An upgrade that touches one cell of every record (or adds a column) should not
requote the cells it did not touch, so this module works one level lower: it finds the raw span
of every cell (quotes included) and replaces only the spans it is told to, appending new cells
before a record's line break.  The CSV dialect is the one the database files use: comma, double
quote, doubled quotes inside quoted cells, ``\\r\\n``/``\\n``/``\\r`` line breaks (inside quotes
too), an optional byte-order mark.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_BOM = "\ufeff"
_QUOTE_TRIGGERS = (",", '"', "\r", "\n")


@dataclass(frozen=True)
class Record:
    """One CSV record: where each cell's raw text lies in the file text, and its line break."""

    line: int  # 1-based line the record starts on
    spans: tuple[tuple[int, int], ...]  # [start, end) of each cell's raw text
    end: int  # where the record's line break starts (its length when it has none)
    terminator: str  # "\r\n", "\n", "\r" or "" (a last record without a line break)


def _line_break(text: str, pos: int) -> str:
    if text.startswith("\r\n", pos):
        return "\r\n"
    return text[pos] if pos < len(text) and text[pos] in "\r\n" else ""


def _skip_quoted(text: str, pos: int) -> tuple[int, int]:
    """From an opening quote to just after its closing quote; returns (position, line breaks passed)."""
    pos += 1
    breaks = 0
    while pos < len(text):
        char = text[pos]
        if char == '"':
            if text.startswith('""', pos):
                pos += 2
                continue
            return pos + 1, breaks
        newline = _line_break(text, pos)
        if newline:
            breaks += 1
            pos += len(newline)
            continue
        pos += 1
    return pos, breaks  # unterminated: the cell runs to the end, as the csv module reads it


def scan(text: str) -> list[Record]:
    """The records of ``text`` (a leading byte-order mark is skipped, not part of any cell)."""
    records: list[Record] = []
    pos = 1 if text.startswith(_BOM) else 0
    line = 1
    while pos < len(text):
        first_line, spans = line, []
        while True:
            start = pos
            if text.startswith('"', pos):
                pos, breaks = _skip_quoted(text, pos)
                line += breaks
            while pos < len(text) and text[pos] not in ",\r\n":
                pos += 1
            spans.append((start, pos))
            if not text.startswith(",", pos):
                break
            pos += 1
        terminator = _line_break(text, pos)
        records.append(Record(first_line, tuple(spans), pos, terminator))
        pos += len(terminator)
        line += 1 if terminator else 0
    return records


def cell_value(raw: str) -> str:
    """The value of a cell's raw text, read as the csv module reads it."""
    if not raw.startswith('"'):
        return raw
    out: list[str] = []
    pos = 1
    while pos < len(raw):
        if raw[pos] == '"':
            if raw.startswith('""', pos):
                out.append('"')
                pos += 2
                continue
            return "".join(out) + raw[pos + 1 :]
        out.append(raw[pos])
        pos += 1
    return "".join(out)


def quote(value: str) -> str:
    """Minimal quoting, as ``csv.QUOTE_MINIMAL`` writes a cell."""
    if any(trigger in value for trigger in _QUOTE_TRIGGERS):
        return '"' + value.replace('"', '""') + '"'
    return value


@dataclass
class CellEditor:
    """The text of one CSV file, a set of cell changes, and the text with only those cells changed."""

    text: str
    records: list[Record] = field(init=False)
    _changes: dict[tuple[int, int], str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.records = scan(self.text)

    def values(self, record: int) -> list[str]:
        return [cell_value(self.text[start:end]) for start, end in self.records[record].spans]

    def is_blank(self, record: int) -> bool:
        return all(not value.strip() for value in self.values(record))

    def set(self, record: int, cell: int, value: str) -> None:
        """Change one cell; a cell past the record's end is appended (any cells between, empty)."""
        if cell < len(self.records[record].spans) and self.values(record)[cell] == value:
            self._changes.pop((record, cell), None)
            return
        self._changes[(record, cell)] = value

    @property
    def changed(self) -> bool:
        return bool(self._changes)

    def render(self) -> str:
        """The text with the changed cells replaced and the appended cells added."""
        pieces: list[str] = []
        cursor = 0
        for index, record in enumerate(self.records):
            width = len(record.spans)
            for cell, (start, end) in enumerate(record.spans):
                if (index, cell) in self._changes:
                    pieces.append(self.text[cursor:start])
                    pieces.append(quote(self._changes[(index, cell)]))
                    cursor = end
            extra = sorted(cell for (row, cell) in self._changes if row == index and cell >= width)
            if extra:
                pieces.append(self.text[cursor : record.end])
                cursor = record.end
                appended = [self._changes.get((index, cell), "") for cell in range(width, extra[-1] + 1)]
                pieces.append("".join("," + quote(value) for value in appended))
        pieces.append(self.text[cursor:])
        return "".join(pieces)
