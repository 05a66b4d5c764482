"""Re-ingesting into an existing database: what is updated, appended, and never touched."""

from __future__ import annotations

import csv
import shutil
import statistics
from pathlib import Path

import pytest

from perf_plugin.database.schema import format_number
from perf_plugin.replay.registry import signature_of
from perf_plugin.database.table import CsvTable
from perf_plugin.ingest.pipeline import ingest_path

ASCEND = Path(__file__).parent / "fixtures" / "ascend"
LEVEL2 = ASCEND / "kernel_details_level2_llm_train.csv"
LEVEL1 = ASCEND / "kernel_details_level1.csv"


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.csv"))}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    directory = tmp_path / "db"
    ingest_path(LEVEL2, directory)
    return directory


def test_reingesting_the_same_profile_is_byte_identical(db: Path) -> None:
    before = snapshot(db)
    mtimes = {p.name: p.stat().st_mtime_ns for p in db.glob("*.csv")}
    report = ingest_path(LEVEL2, db)
    assert snapshot(db) == before
    assert {p.name: p.stat().st_mtime_ns for p in db.glob("*.csv")} == mtimes  # nothing rewritten
    assert report.merge is not None
    assert report.merge.rows_appended == 0 and report.merge.rows_updated == 0


def test_microbench_and_unknown_columns_are_untouched(db: Path) -> None:
    path = db / "MatMulV3.csv"
    table = CsvTable.read(path)
    original = [table.row_dict(i) for i in range(len(table))]
    # what a write-back run leaves behind, plus a column some other tool added
    table.insert_column("Average Duration(us)", table.index("Profiling Average Duration(us)"))
    table.insert_column("MicroBench aicore_time(us)", table.index("Profiling Average aicore_time(us)"))
    table.insert_column("Notes")
    table.set(0, "Average Duration(us)", "150.5")
    table.set(0, "MicroBench aicore_time(us)", "140.25")
    table.set(0, "Notes", "checked, by hand")
    table.set(0, "Profiling Average Duration(us)", "1")  # stale profiling value
    table.set(1, "Profiling Count", "999")
    removed = table.row_dict(2)
    table.delete_rows([2])
    table.write(path)

    report = ingest_path(LEVEL2, db)
    rows = read_rows(path)
    header = list(rows[0])
    assert header.index("Average Duration(us)") == header.index("Profiling Average Duration(us)") - 1
    assert header.index("MicroBench aicore_time(us)") == header.index("Profiling Average aicore_time(us)") - 1
    assert header[-1] == "Notes"

    assert rows[0]["Average Duration(us)"] == "150.5"
    assert rows[0]["MicroBench aicore_time(us)"] == "140.25"
    assert rows[0]["Notes"] == "checked, by hand"
    assert rows[0]["Profiling Average Duration(us)"] == original[0]["Profiling Average Duration(us)"]
    assert rows[1]["Profiling Count"] == original[1]["Profiling Count"]
    # the deleted signature comes back, at the end, with its profiling values
    assert len(rows) == len(original)
    assert {k: rows[-1][k] for k in removed} == removed
    assert rows[-1]["Average Duration(us)"] == "" and rows[-1]["Notes"] == ""
    (change,) = [c for c in report.merge.files if c.kernel_type == "MatMulV3"]
    assert (change.updated, change.appended) == (2, 1)


def test_plain_database_rows_are_matched_by_signature(tmp_path: Path) -> None:
    # A hand-written database (plain shape cells, the second operand stored as K,N) matches the
    # profiled MatMulV3 kernel 4096,1024 x 6144,1024 through the canonical MatMul signature.
    directory = tmp_path / "db"
    directory.mkdir()
    path = directory / "MatMulV3.csv"
    path.write_text(
        "Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats,"
        "Average Duration(us)\n"
        '"4096,1024;1024,6144",DT_BF16;DT_BF16,ND;ND,"4096,6144",DT_BF16,ND,77.0\n'
        '"8,16;16,32",DT_BF16;DT_BF16,ND;ND,"8,32",DT_BF16,ND,1.5\n',
        encoding="utf-8",
    )
    ingest_path(LEVEL2, directory)
    rows = read_rows(path)
    profiled = [
        float(r["Duration(us)"])
        for r in read_rows(LEVEL2)
        if r["Type"] == "MatMulV3" and r["Input Shapes"] == '"4096,1024;6144,1024"'
    ]
    assert rows[0]["Input Shapes"] == "4096,1024;1024,6144"  # identity cells kept as written
    assert rows[0]["Average Duration(us)"] == "77.0"
    assert rows[0]["Profiling Average Duration(us)"] == format_number(statistics.fmean(profiled), 6)
    assert rows[0]["Profiling Count"] == str(len(profiled))
    assert rows[1]["Profiling Average Duration(us)"] == "" and rows[1]["Average Duration(us)"] == "1.5"
    # appended rows follow the file's plain quoting; profiling columns sit after Average Duration(us)
    assert all(not r["Input Shapes"].startswith('"') for r in rows)
    header = list(rows[0])
    assert header[6:10] == [
        "Average Duration(us)",
        "Profiling Average Duration(us)",
        "Profiling Median Duration(us)",
        "Profiling Std Duration(us)",
    ]
    assert "OP State" not in header and header[-1] == "Profiling Count"
    signatures = [signature_of("MatMulV3", r) for r in rows]
    assert len(signatures) == len(set(signatures))


def test_second_profile_adds_rows_and_keeps_the_first(tmp_path: Path) -> None:
    directory = tmp_path / "db"
    ingest_path(LEVEL2, directory)
    level2_matmul = read_rows(directory / "MatMulV2.csv")
    ingest_path(LEVEL1, directory)
    merged = read_rows(directory / "MatMulV2.csv")
    assert merged[: len(level2_matmul)] == level2_matmul  # different signatures: untouched
    level1_groups = {
        (r["Input Shapes"], r["Input Data Types"], r["Output Shapes"])
        for r in read_rows(LEVEL1)
        if r["Type"] == "MatMulV2"
    }
    assert len(merged) == len(level2_matmul) + len(level1_groups)
    assert (directory / "Conv2D.csv").exists()


def test_merge_keeps_line_endings_and_bom(tmp_path: Path) -> None:
    directory = tmp_path / "db"
    ingest_path(LEVEL2, directory)
    path = directory / "SwiGlu.csv"
    text = path.read_text(encoding="utf-8").replace("\n", "\r\n")
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    before = path.read_bytes()
    ingest_path(LEVEL2, directory)
    assert path.read_bytes() == before


def test_existing_file_without_signature_columns_is_an_error(tmp_path: Path) -> None:
    from perf_plugin.database.errors import DatabaseError

    directory = tmp_path / "db"
    directory.mkdir()
    (directory / "SwiGlu.csv").write_text("Shape,Latency\n1,2\n", encoding="utf-8")
    shutil.copy(LEVEL2, tmp_path / "kernel_details.csv")
    with pytest.raises(DatabaseError) as info:
        ingest_path(tmp_path / "kernel_details.csv", directory)
    assert info.value.path == directory / "SwiGlu.csv"
    assert "'Input Shapes'" in str(info.value)
    assert sorted(p.name for p in directory.glob("*.csv")) == ["SwiGlu.csv"]  # nothing else written
