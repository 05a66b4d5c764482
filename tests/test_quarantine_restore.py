"""Rows set aside by write-back come back with one command: ``perfdb restore-quarantine``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from perf_plugin.cli import main as perfdb
from perf_plugin.database.quarantine import QUARANTINE_REASON, restore_file, set_aside
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
    assert CsvTable.read(source).row_dict(rows) == original


def test_a_kernel_type_without_a_quarantine_file_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert perfdb(["restore-quarantine", str(tmp_path), "--kernel-type", "MatMulV2"]) == 2
    assert "no quarantine file for MatMulV2" in capsys.readouterr().err
    assert perfdb(["restore-quarantine", str(tmp_path / "missing")]) == 2
    assert "not a database directory" in capsys.readouterr().err
