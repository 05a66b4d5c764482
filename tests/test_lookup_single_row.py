"""Element-wise lookups on rows the CUDA replay measured on an H100: a call over one row is a
family of its own (``lookup/by_size.py``).  Fixture: Llama-3.1-8B's, Qwen3-32B's and
Llama-3.1-70B's ``SwiGlu`` rows at 25 token counts (source: ``tests/fixtures/cuda/SOURCES.md``),
with the H100 peaks of ``h100_norms``."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from perf_plugin.lookup import lookup
from perf_plugin.lookup.answer import INTERPOLATED
from perf_plugin.lookup.command import make_query
from perf_plugin.lookup.peaks import PEAKS_FILE
from perf_plugin.lookup.rows import read_rows
from tests.held_out import write_without

FIXTURES = Path(__file__).parent / "fixtures" / "cuda"
CSV = "SwiGlu.csv"


def _without(tmp_path: Path, shape: str) -> tuple[Path, dict[str, str]]:
    (held,) = write_without(FIXTURES / "h100_swiglu" / CSV, tmp_path, lambda _, cells: cells["Input Shapes"] == shape)
    shutil.copy(FIXTURES / "h100_norms" / PEAKS_FILE, tmp_path / PEAKS_FILE)
    return tmp_path, held


def _rows_of(db: Path, lines: tuple[int, ...]) -> set[int]:
    """The row counts (first input's leading dims) of the answer's rows."""
    by_line = {row.line: row for row in read_rows(db / CSV)}
    return {math.prod(by_line[line].input_shapes[0][:-1]) for line in lines}  # type: ignore[index]


def test_one_row_is_answered_from_one_row_calls(tmp_path: Path) -> None:
    """One row of 6400 (2.68 us): the two-row call of the same bytes took 4.1 us; answered from
    the other one-row calls only, within 10 % (from the two-row call, 52 % long)."""
    db, held = _without(tmp_path, "1,6400")
    answer = lookup(db, make_query({"Kernel Type": "SwiGlu", **held}))
    assert answer.provenance == INTERPOLATED and _rows_of(db, answer.rows) == {1}
    assert answer.duration_us == pytest.approx(float(held["Average Duration(us)"]), rel=0.10)


def test_more_rows_are_never_answered_from_one_row_calls(tmp_path: Path) -> None:
    """Two rows of 25600 (6.59 us) share their bytes with one row of 51200 (3.40 us)."""
    db, held = _without(tmp_path, "2,25600")
    answer = lookup(db, make_query({"Kernel Type": "SwiGlu", **held}))
    assert answer.provenance == INTERPOLATED and 1 not in _rows_of(db, answer.rows)
    assert answer.duration_us == pytest.approx(float(held["Average Duration(us)"]), rel=0.03)
