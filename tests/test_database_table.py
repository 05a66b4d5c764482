"""CsvTable: byte-for-byte round trip on the real files, targeted changes, atomic writes."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from perf_plugin.database import atomic
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.table import CsvTable
from tests.conftest import ASCEND

REAL_CSVS = sorted(p.name for p in ASCEND.glob("*.csv"))


@pytest.mark.parametrize("name", REAL_CSVS)
def test_unchanged_real_file_round_trips_byte_for_byte(name: str, tmp_path: Path) -> None:
    source = ASCEND / name
    table = CsvTable.read(source)
    target = tmp_path / name
    table.write(target)
    assert target.read_bytes() == source.read_bytes()


def test_rows_and_cells_match_the_csv_module() -> None:
    source = ASCEND / "kernel_details_level1.csv"
    with source.open(newline="") as handle:
        expected = list(csv.reader(handle))
    table = CsvTable.read(source)
    assert table.header == expected[0]
    assert table.rows == expected[1:]
    assert table.newline == "\r\n"


def test_multiline_quoted_records_keep_their_line_numbers() -> None:
    # operator_details has quoted cells spanning several lines: 6224 lines, fewer records
    source = ASCEND / "operator_details_level1.csv"
    with source.open(newline="") as handle:
        expected = list(csv.reader(handle))
    table = CsvTable.read(source)
    assert len(table) == len(expected) - 1
    assert table.line_of(0) == 2
    assert table.line_of(len(table) - 1) > len(table)


def test_changing_one_cell_rewrites_only_that_record(tmp_path: Path) -> None:
    source = ASCEND / "kernel_details_level2_llm_train.csv"
    original = source.read_bytes().decode()
    table = CsvTable.read(source)
    table.set(3, "Duration(us)", "12.5")
    text = table.to_text()
    old_lines, new_lines = original.split("\n"), text.split("\n")
    assert len(old_lines) == len(new_lines)
    changed = [i for i, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b]
    assert changed == [4]  # header is line index 0, row 3 is index 4
    # the embedded-quote shape form and the tab after the start time survive re-serialisation
    row = next(csv.reader(io.StringIO(new_lines[4])))
    assert row[table.index("Duration(us)")] == "12.5"
    assert new_lines[4].count('"""') == old_lines[4].count('"""')
    assert "\t," in new_lines[4]


def test_insert_column_places_it_and_keeps_other_cells() -> None:
    table = CsvTable.read(ASCEND / "db_row_TransposeBatchMatMul.csv")
    table.insert_column("New", 2)
    assert table.header[2] == "New"
    parsed = list(csv.reader(io.StringIO(table.to_text())))
    assert parsed[1][:2] == ["4,16,128;16,128,512", "DT_BF16;DT_BF16"]
    assert parsed[1][2] == ""
    assert parsed[1][3] == "ND;ND"


def test_append_row_adds_unknown_columns_at_the_end() -> None:
    table = CsvTable.read(ASCEND / "db_row_TransposeBatchMatMul.csv")
    table.append_row({"Input Shapes": "1,2;2,3", "Extra": "x"})
    assert table.header[-1] == "Extra"
    parsed = list(csv.reader(io.StringIO(table.to_text())))
    assert parsed[-1][0] == "1,2;2,3" and parsed[-1][-1] == "x"
    assert len(parsed) == 4


def test_file_without_trailing_newline_keeps_it_missing(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"a,b\r\n1,2")
    table = CsvTable.read(path)
    table.write()
    assert path.read_bytes() == b"a,b\r\n1,2"
    table.append_row({"a": "3", "b": "4"})
    table.write()
    assert path.read_bytes() == b"a,b\r\n1,2\r\n3,4"


def test_bom_is_preserved(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes("\ufeffa,b\n1,2\n".encode())
    table = CsvTable.read(path)
    assert table.header == ["a", "b"]
    table.write()
    assert path.read_bytes() == "\ufeffa,b\n1,2\n".encode()


def test_failure_while_writing_leaves_the_old_file_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "MatMulV3.csv"
    path.write_bytes(b"Input Shapes,Average Duration(us)\n\"1,2;2,3\",5\n")
    before = path.read_bytes()
    table = CsvTable.read(path)
    table.set(0, "Average Duration(us)", "7")

    def exploding_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", exploding_fsync)
    with pytest.raises(OSError):
        table.write()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["MatMulV3.csv"]  # no temporary file left


def test_atomic_write_keeps_permissions(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a\n")
    os.chmod(path, 0o640)
    atomic.atomic_write_text(path, "b\n")
    assert path.read_text() == "b\n"
    assert path.stat().st_mode & 0o777 == 0o640


def test_unreadable_file_is_a_database_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(b"a,b\n\xff\xfe,1\n")
    with pytest.raises(DatabaseError) as info:
        CsvTable.read(path)
    assert str(path) in str(info.value) and "UTF-8" in str(info.value)


def test_deleting_rows_marks_the_table_changed(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a\n1\n2\n3\n")
    table = CsvTable.read(path)
    assert not table.changed
    table.delete_rows([1])
    assert table.changed
    table.write()
    assert path.read_text() == "a\n1\n3\n"


def test_new_files_get_the_usual_permissions(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        atomic.atomic_write_text(tmp_path / "new.csv", "a\n")
    finally:
        os.umask(old)
    assert (tmp_path / "new.csv").stat().st_mode & 0o777 == 0o644


def test_a_streamed_write_that_fails_midway_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "run_report.json"
    path.write_text("before\n")

    def pieces() -> Iterator[str]:
        yield "{\n"
        raise RuntimeError("a case's entry could not be rendered")

    with pytest.raises(RuntimeError):
        atomic.atomic_write_text_chunks(path, pieces())
    assert path.read_text() == "before\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run_report.json"]  # no temporary file left
    atomic.atomic_write_text_chunks(path, iter(["{", "\n", "}\n"]))
    assert path.read_text() == "{\n}\n"


def test_rows_share_one_object_per_distinct_cell_text(tmp_path: Path) -> None:
    path = tmp_path / "Add.csv"
    path.write_text("OP State,Input Data Types\ndynamic,FLOAT;FLOAT\ndynamic,FLOAT;FLOAT\nstatic,FLOAT;FLOAT\n")
    table = CsvTable.read(path)
    assert [table.get(i, "OP State") for i in range(3)] == ["dynamic", "dynamic", "static"]
    assert table.get(0, "OP State") is table.get(1, "OP State")
    assert table.get(0, "Input Data Types") is table.get(2, "Input Data Types")
