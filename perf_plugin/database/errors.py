"""One exception type for bad database input, carrying the file, row and column it concerns."""

from __future__ import annotations

from pathlib import Path


class DatabaseError(Exception):
    """A user-facing error about a database file.

    ``row`` is the 1-based line number of the record in the file (the header is line 1), so
    the message points where a person opening the file in an editor would look.
    """

    def __init__(
        self,
        reason: str,
        *,
        path: str | Path | None = None,
        row: int | None = None,
        column: str | None = None,
    ) -> None:
        self.reason = reason
        self.path = Path(path) if path is not None else None
        self.row = row
        self.column = column
        super().__init__(self.describe())

    def describe(self) -> str:
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.column is not None:
            where.append(f"column {self.column!r}")
        prefix = ", ".join(where)
        return f"{prefix}: {self.reason}" if prefix else self.reason

    def located(
        self, *, path: str | Path | None = None, row: int | None = None, column: str | None = None
    ) -> "DatabaseError":
        """The same error with missing location fields filled in."""
        return type(self)(
            self.reason,
            path=self.path if self.path is not None else path,
            row=self.row if self.row is not None else row,
            column=self.column if self.column is not None else column,
        )


class IncompleteRow(DatabaseError):
    """A row whose cells parse but leave out what a replay needs (a shape without its dtype:
    profilers record no dtypes for tensors passed in a list).  Not malformed: it stays in its CSV."""
