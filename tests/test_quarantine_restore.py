"""Rows set aside by write-back come back with one command: ``perfdb restore-quarantine``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from perf_plugin.cli import main as perfdb
from perf_plugin.database.quarantine import (
    QUARANTINE_LINE,
    QUARANTINE_REASON,
    QUARANTINE_TIME,
    quarantine_path,
    restore_file,
    set_aside,
)
from perf_plugin.database.table import CsvTable
from tests.conftest import ASCEND
from tests.test_plugin import HEADER, MATMUL_ROWS, _profiler_modules_loaded, project, read_rows, run, write_csv  # noqa: F401

MALFORMED = 'dynamic,AI_CORE,"""32,x;64,16""",FLOAT;FLOAT,ND;ND,"""32,16""",FLOAT,ND,7.5,malformed shape'
UNKNOWN_DTYPE = 'dynamic,AI_CORE,"""32,64;64,16""",DT_COMPLEX99;FLOAT,ND;ND,"""32,16""",FLOAT,ND,,unknown dtype'


def test_a_fixed_row_goes_back_and_is_measured(pytester: pytest.Pytester, project: Path) -> None:  # noqa: F811
    write_csv(project / "MatMulV2.csv", HEADER + ",Profiling Average Duration(us),Note",
              [MATMUL_ROWS[0] + ",5.5,kept", MALFORMED, UNKNOWN_DTYPE])
    run(pytester, project, "-k", "MatMulV2").assert_outcomes(passed=1, skipped=2)
    quarantine = project / "MatMulV2.quarantine.csv"
    assert [r["Note"] for r in read_rows(quarantine)] == ["malformed shape", "unknown dtype"]

    # the user fixes the malformed cell in the quarantine file, then brings both rows back
    quarantine.write_text(quarantine.read_text().replace('"""32,x;64,16"""', '"""32,48;48,16"""'))
    assert perfdb(["restore-quarantine", str(project), "--dry-run"]) == 0
    assert quarantine.exists()
    assert perfdb(["restore-quarantine", str(project)]) == 0
    assert not quarantine.exists()
    rows = read_rows(project / "MatMulV2.csv")
    assert [r["Note"] for r in rows] == ["kept", "malformed shape", "unknown dtype"]
    assert rows[1]["Profiling Average Duration(us)"] == "7.5"  # every profiled value back in place
    assert QUARANTINE_REASON not in rows[0]

    # the next run measures the fixed row; the still-unknown dtype is set aside again
    run(pytester, project, "-k", "MatMulV2").assert_outcomes(passed=2, skipped=1)
    rows = read_rows(project / "MatMulV2.csv")
    assert [r["Note"] for r in rows] == ["kept", "malformed shape"]
    assert float(rows[1]["Average Duration(us)"]) > 0
    assert [r["Note"] for r in read_rows(quarantine)] == ["unknown dtype"]


def test_restoring_twice_or_after_an_interruption_adds_no_row_twice(tmp_path: Path) -> None:
    source = tmp_path / "TransposeBatchMatMul.csv"
    shutil.copy(ASCEND / "db_row_TransposeBatchMatMul.csv", source)  # a real database row
    table = CsvTable.read(source)
    original = table.row_dict(0)
    saved = set_aside(tmp_path, source.name, table, [(0, "a reason")], "20261125_000000")
    table.delete_rows([0])  # as write-back does, once the quarantine file is written
    table.write(source)
    rows = len(table)
    copy = tmp_path / "copy.csv"
    shutil.copy(saved, copy)
    # interrupted between writing the kernel CSV and removing the quarantine file: the row is
    # in both, and restoring again finds it there
    first = restore_file(saved)
    shutil.copy(copy, saved)
    second = restore_file(saved)
    assert (first.restored, first.already_there) == (1, 0)
    assert (second.restored, second.already_there) == (0, 1)
    assert len(CsvTable.read(source)) == rows + 1
    assert CsvTable.read(source).row_dict(0) == original  # back at the line it left, the first


def test_a_kernel_type_without_a_quarantine_file_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert perfdb(["restore-quarantine", str(tmp_path), "--kernel-type", "MatMulV2"]) == 2
    assert "no quarantine file for MatMulV2" in capsys.readouterr().err
    assert perfdb(["restore-quarantine", str(tmp_path / "missing")]) == 2
    assert "not a database directory" in capsys.readouterr().err



INCONSISTENT = 'dynamic,AI_CORE,"""32,64;65,16""",FLOAT;FLOAT,ND;ND,"""32,16""",FLOAT,ND,9.25,inconsistent'


def test_a_round_trip_through_write_back_gives_the_file_back_byte_for_byte(
    pytester: pytest.Pytester, project: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    # rows the replay cannot build stay where they are and get no duration, so the file changes
    # only by the rows set aside; CRLF and no final line break, as a Windows tool writes it
    target = project / "MatMulV2.csv"
    lines = [
        HEADER + ",Profiling Average Duration(us),Note",
        INCONSISTENT,
        MALFORMED,
        INCONSISTENT.replace("9.25", "1.5"),
        UNKNOWN_DTYPE,
        INCONSISTENT.replace("9.25", "2.5"),
    ]
    target.write_bytes("\r\n".join(lines).encode())
    original = target.read_bytes()
    run(pytester, project, "-k", "MatMulV2").assert_outcomes(skipped=5)
    assert [r["Note"] for r in read_rows(target)] == ["inconsistent"] * 3
    assert [r[QUARANTINE_LINE] for r in read_rows(project / "MatMulV2.quarantine.csv")] == ["3", "5"]
    capsys.readouterr()
    assert perfdb(["restore-quarantine", str(project)]) == 0
    assert "restored 2 row(s) into MatMulV2.csv" in capsys.readouterr().out
    assert target.read_bytes() == original


def _quarantine(path: Path, indices: list[int], timestamp: str) -> None:
    """What write-back does to rows it sets aside: into the quarantine file, then out of the CSV."""
    table = CsvTable.read(path)
    set_aside(path.parent, path.name, table, [(i, "a reason") for i in indices], timestamp)
    table.delete_rows(indices)
    table.write(path)


def _notes(path: Path) -> list[str]:
    return [r["Note"] for r in read_rows(path)]


def _row(note: str) -> str:
    return f'dynamic,AI_CORE,"""8,{len(note)}""",FLOAT,ND,"""8,8""",FLOAT,ND,{note}'


def test_rows_of_several_write_backs_go_back_to_their_lines(tmp_path: Path) -> None:
    target = tmp_path / "Softmax.csv"
    rows = [_row(note) for note in "ABCDEFGH"]
    rows[1] = _row('"B on\ntwo lines"')  # a quoted cell spanning lines shifts every line after it
    rows[5] = _row('"F on\ntwo lines"')
    target.write_text("\n".join([HEADER + ",Note", *rows]) + "\n")
    original = target.read_bytes()
    _quarantine(target, [2, 5], "20261125_000000")  # C, and F (whose cell spans two lines)
    _quarantine(target, [3], "20261126_000000")  # E, at its line in the file as the first left it
    assert _notes(target) == ["A", "B on\ntwo lines", "D", "G", "H"]
    result = restore_file(quarantine_path(tmp_path, target.name))
    assert (result.restored, result.already_there, result.at_the_end) == (3, 0, 0)
    assert target.read_bytes() == original
    assert not quarantine_path(tmp_path, target.name).exists()


def test_two_identical_rows_set_aside_both_come_back(tmp_path: Path) -> None:
    target = tmp_path / "Softmax.csv"
    target.write_text("\n".join([HEADER + ",Note", _row("A"), _row("M"), _row("B"), _row("M")]) + "\n")
    original = target.read_bytes()
    _quarantine(target, [1, 3], "20261125_000000")
    assert restore_file(quarantine_path(tmp_path, target.name)).restored == 2
    assert target.read_bytes() == original


def test_rows_restored_into_a_changed_file_keep_their_order_and_none_is_lost(tmp_path: Path) -> None:
    target = tmp_path / "Softmax.csv"
    target.write_text("\n".join([HEADER + ",Note", *(_row(note) for note in "ABCDEFGH")]) + "\n")
    _quarantine(target, [5, 2], "20261125_000000")  # F and C (write-back lists them in any order)
    # since then someone removed B, put Y first and Z last
    table = CsvTable.read(target)
    table.delete_rows([1])
    table.write(target)
    target.write_text(target.read_text().replace(HEADER + ",Note\n", HEADER + ",Note\n" + _row("Y") + "\n") + _row("Z") + "\n")
    assert _notes(target) == ["Y", "A", "D", "E", "G", "H", "Z"]
    result = restore_file(quarantine_path(tmp_path, target.name))
    assert (result.restored, result.already_there) == (2, 0)
    # each lands before the first row now at or past the line it left (C: 4, F: 7)
    assert _notes(target) == ["Y", "A", "C", "D", "E", "F", "G", "H", "Z"]


def test_a_quarantine_file_written_before_lines_were_recorded_is_appended_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "Softmax.csv"
    target.write_text("\n".join([HEADER + ",Note", _row("A"), _row("C")]) + "\n")
    old = quarantine_path(tmp_path, target.name)
    old.write_text("\n".join([f"{HEADER},Note,{QUARANTINE_REASON},{QUARANTINE_TIME}", _row("B") + ",a reason,20261125_000000"]) + "\n")
    assert perfdb(["restore-quarantine", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "restored 1 row(s) into Softmax.csv; 1 of them appended at the end" in out
    assert "written before quarantine files recorded each row's line" in out
    assert _notes(target) == ["A", "C", "B"]
