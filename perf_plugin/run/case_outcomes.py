"""How a case that cannot be measured ends: skipped (it cannot run here) or failed (it ran and
was wrong, or its row is bad), each with the reason the test report shows."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from perf_plugin.database.errors import DatabaseError

if TYPE_CHECKING:
    from perf_plugin.run.cases import Case


class CaseSkip(Exception):
    """The case cannot run here (its tensors exceed free device memory, an API is missing)."""


class CaseFailure(Exception):
    """The replay ran and was wrong, raised, or could not be built from the row."""


@contextlib.contextmanager
def bad_cells_fail(case: "Case") -> Iterator[None]:
    """Turns a bad cell of the case's row (a DatabaseError naming its column) into the case's
    failure, naming the file, row and column."""
    try:
        yield
    except DatabaseError as exc:
        raise CaseFailure(exc.located(path=case.ref.csv_file, row=case.ref.row_line).describe()) from None
