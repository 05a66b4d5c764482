"""msprof op_summary files and PROF_* directories, and directory discovery.

No genuine op_summary_*.csv is public.  The tests build one from the real kernel_details
fixture by applying, in the test, the documented renaming (``Name -> Op Name``, ``Type -> OP
Type``, ``Accelerator Core -> Task Type``, ``Start Time(us) -> Task Start Time(us)``,
``Duration(us) -> Task Duration(us)``, ``Wait Time(us) -> Task Wait Time(us)``) and the newer
``Block Num`` / ``Mix Block Num`` names, dropping ``Step Id`` which op_summary does not have.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from perf_plugin.database.errors import DatabaseError
from perf_plugin.replay.registry import signature_of
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.ingest.records import read_prof_directory
from tests.conftest import OP_SUMMARY_COLUMNS

ASCEND = Path(__file__).parent / "fixtures" / "ascend"
LEVEL2 = ASCEND / "kernel_details_level2_llm_train.csv"
RENAMES = OP_SUMMARY_COLUMNS


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def write_op_summary(path: Path, rows: list[dict[str, str]]) -> None:
    source = [h for h in rows[0] if h != "Step Id"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([RENAMES.get(h, h) for h in source])
        writer.writerows([row[h] for h in source] for row in rows)


@pytest.fixture
def prof_dir(tmp_path: Path) -> Path:
    """A PROF_* tree whose export was sliced in two, as msprof does for long runs."""
    rows = read_rows(LEVEL2)
    root = tmp_path / "PROF_000001_20250101000000000_ABCDEFG"
    output = root / "mindstudio_profiler_output"
    half = len(rows) // 2
    write_op_summary(output / "op_summary_slice_0_20250101000000.csv", rows[:half])
    write_op_summary(output / "op_summary_slice_1_20250101000000.csv", rows[half:])
    return root


def test_op_summary_aggregates_like_kernel_details(prof_dir: Path) -> None:
    from_op_summary = ingest_path(prof_dir, None)
    from_kernel_details = ingest_path(LEVEL2, None)
    assert from_op_summary.discovery is not None and from_op_summary.discovery.kind == "op_summary"
    assert len(from_op_summary.discovery.files) == 2
    assert from_op_summary.rows == from_kernel_details.rows
    assert from_op_summary.communication == from_kernel_details.communication


def test_single_op_summary_file(prof_dir: Path, tmp_path: Path) -> None:
    rows = read_rows(LEVEL2)
    path = tmp_path / "op_summary_0_1_1.csv"
    write_op_summary(path, rows)
    assert ingest_path(path, None).rows == ingest_path(LEVEL2, None).rows


def test_prof_directory_records(prof_dir: Path) -> None:
    source = [r for r in read_rows(LEVEL2) if not r["Type"].startswith("hcom_")]
    header = list(source[0])
    counters = header[header.index("Context ID") + 1 :]
    records = read_prof_directory(prof_dir)
    assert len(records) == len(source)
    for record, row in zip(records, source):
        assert record.kernel_type == row["Type"]
        assert record.name == row["Name"]
        assert record.duration_us == float(row["Duration(us)"])
        assert record.start_us == float(row["Start Time(us)"].strip())
        assert record.cells["Input Shapes"] == row["Input Shapes"]
        assert record.signature() == signature_of(row["Type"], row)
        expected_counters = {c: float(row[c]) for c in counters if row[c] != "N/A"}
        assert record.counters == expected_counters
    assert records[0].source is not None and records[0].source.name.startswith("op_summary_slice_0_")
    assert records[0].line == 2
    with_comm = read_prof_directory(prof_dir, include_communication=True)
    assert sum(r.communication for r in with_comm) == 15


def test_older_device_summary_layout(tmp_path: Path) -> None:
    rows = read_rows(LEVEL2)
    root = tmp_path / "PROF_000002"
    write_op_summary(root / "device_0" / "summary" / "op_summary_0_1_1.csv", rows)
    (root / "device_0" / "data").mkdir()
    assert len(read_prof_directory(root)) == len(rows) - 15
    assert ingest_path(root, None).rows == ingest_path(LEVEL2, None).rows


def test_prof_directory_without_op_summary(tmp_path: Path) -> None:
    (tmp_path / "PROF_1" / "device_0" / "data").mkdir(parents=True)
    with pytest.raises(DatabaseError, match="msprof --export=on"):
        read_prof_directory(tmp_path / "PROF_1")


def test_kernel_details_preferred_over_the_prof_tree_beside_it(tmp_path: Path, prof_dir: Path) -> None:
    # torch_npu writes ASCEND_PROFILER_OUTPUT/ and the PROF_* tree it was built from: one profile.
    run = tmp_path / "rank0_ascend_pt"
    shutil.move(str(prof_dir), run / prof_dir.name)
    output = run / "ASCEND_PROFILER_OUTPUT"
    output.mkdir()
    shutil.copy(LEVEL2, output / "kernel_details.csv")
    shutil.copy(ASCEND / "operator_details_level1.csv", output / "operator_details.csv")
    report = ingest_path(run, None)
    assert report.discovery is not None
    assert report.discovery.kind == "kernel_details"
    assert report.discovery.files == [output / "kernel_details.csv"]
    assert len(report.discovery.ignored) == 2
    assert report.table.rows_read == len(read_rows(LEVEL2))  # counted once
    lines = "\n".join(report.lines())
    assert f"operator_details.csv: {output / 'operator_details.csv'}" in lines
    assert "trace_view.json: not found" in lines


def test_directory_with_no_profile(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing here", encoding="utf-8")
    with pytest.raises(DatabaseError, match="no profiler output found") as info:
        ingest_path(tmp_path, None)
    assert info.value.path == tmp_path


def test_op_summary_missing_columns_named_in_its_own_spelling(tmp_path: Path) -> None:
    rows = read_rows(LEVEL2)
    for row in rows:
        del row["Duration(us)"]
    path = tmp_path / "op_summary_0_1_1.csv"
    write_op_summary(path, rows)
    with pytest.raises(DatabaseError, match="'Task Duration\\(us\\)'"):
        ingest_path(path, None)
