"""Files that stand in for a database CSV without being one: a Git LFS pointer, an empty file, a
binary file.  Each is refused with the file's name and what to do, by the table reader, by
``perfdb`` and by a replay run, which fails before measuring anything and writes nothing.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import pytest

from perf_plugin.cli import main as perfdb
from perf_plugin.comm.collectives import COLLECTIVES, parse_dtype
from perf_plugin.comm.plan import CommCase
from perf_plugin.comm.record import CommResult
from perf_plugin.comm.writer import upsert_result
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.file_kind import (
    EmptyFile,
    FileKind,
    LfsPointerFile,
    NotCsvFile,
    UnusableFile,
    classify,
)
from perf_plugin.database.table import CsvTable
from tests.conftest import ASCEND
from tests.test_plugin import (
    BENCH_TEST,
    HEADER,
    MATMUL_ROWS,
    _profiler_modules_loaded,  # noqa: F401  (torch.profiler's lazy imports, before pytester)
    run,
    write_csv,
)

LFS_FIX = "is a Git LFS pointer, not the CSV: run `git lfs pull` in the database's repository"
EMPTY_FIX = "is empty (0 bytes): delete it or regenerate it"
BINARY_FIX = "is a binary file (NUL byte at offset 3), not a CSV: replace it with the CSV or remove it"
# rows of a public Ascend database, in its format (tests/fixtures/ascend/SOURCES.md)
REAL_CSV = (ASCEND / "db_row_TransposeBatchMatMul.csv").read_bytes()


def lfs_pointer(content: bytes) -> bytes:
    """The pointer git-lfs commits in place of ``content`` (its spec: version, oid, size; LF endings)."""
    oid = hashlib.sha256(content).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(content)}\n".encode()


# What stands in for a CSV, and the one line that names it.
STAND_INS = {
    "lfs-pointer": (lfs_pointer(REAL_CSV), LfsPointerFile, f"{LFS_FIX} (its content, {len(REAL_CSV)} bytes, was never downloaded)"),
    "empty": (b"", EmptyFile, EMPTY_FIX),
    "binary": (gzip.compress(REAL_CSV, mtime=0), NotCsvFile, BINARY_FIX),  # a compressed CSV under the CSV's name
}


# ----------------------------------------------------------------------------- classification
@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (REAL_CSV, FileKind.TEXT),
        (lfs_pointer(REAL_CSV), FileKind.LFS_POINTER),
        (lfs_pointer(REAL_CSV).replace(b"git-lfs.github.com", b"hawser.github.com"), FileKind.LFS_POINTER),
        (b"", FileKind.EMPTY),
        (b" \r\n\n\t", FileKind.EMPTY),
        (b"\xef\xbb\xbf\n", FileKind.EMPTY),  # a byte-order mark and nothing else
        (gzip.compress(REAL_CSV, mtime=0), FileKind.BINARY),
        ("Input Shapes\n8\n".encode("utf-16"), FileKind.UTF16),
    ],
    ids=["csv", "lfs-pointer", "lfs-pointer-pre-release", "empty", "whitespace", "bom-only", "binary", "utf-16"],
)
def test_a_file_is_classified_from_its_first_bytes(data: bytes, kind: FileKind) -> None:
    assert classify(data, len(data)) is kind


def test_only_a_pointer_sized_file_is_a_pointer() -> None:
    # git-lfs takes no blob of 1024 bytes or more for a pointer: a CSV that happens to start
    # with the version line is read as the CSV it is
    data = lfs_pointer(REAL_CSV) + b"x" * 1024
    assert classify(data, len(data)) is FileKind.TEXT
    # a file read in part: the size decides emptiness, not the bytes read
    assert classify(b"   ", 4096) is FileKind.TEXT


# ----------------------------------------------------------------------------- the table reader
@pytest.mark.parametrize("name", list(STAND_INS))
def test_the_table_reader_refuses_a_stand_in_by_name(tmp_path: Path, name: str) -> None:
    data, error_type, fix = STAND_INS[name]
    path = tmp_path / "MatMulV3.csv"
    path.write_bytes(data)
    with pytest.raises(error_type) as info:
        CsvTable.read(path)
    assert str(info.value).startswith(f"{path}: {fix}")
    assert isinstance(info.value, DatabaseError)


def test_the_pointer_error_says_how_large_the_missing_content_is(tmp_path: Path) -> None:
    path = tmp_path / "MatMulV3.csv"
    path.write_bytes(lfs_pointer(REAL_CSV))
    with pytest.raises(LfsPointerFile, match=f"its content, {len(REAL_CSV)} bytes, was never downloaded"):
        CsvTable.read(path)


def test_whitespace_and_other_encodings_are_named(tmp_path: Path) -> None:
    path = tmp_path / "Add.csv"
    path.write_bytes(b"\n\n")
    with pytest.raises(EmptyFile, match=r"is empty \(whitespace only\)"):
        CsvTable.read(path)
    path.write_bytes("Input Shapes\n8\n".encode("utf-16"))
    with pytest.raises(NotCsvFile, match="is UTF-16 text, not a UTF-8 CSV: save it as UTF-8"):
        CsvTable.read(path)
    path.write_bytes("Input Shapes\nFÜR\n".encode("latin-1"))
    with pytest.raises(NotCsvFile, match=r"is not UTF-8 text \(byte 14\)"):
        CsvTable.read(path)


def test_a_real_csv_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "TransposeBatchMatMul.csv"
    path.write_bytes(REAL_CSV)
    assert CsvTable.read(path).to_text().encode() == REAL_CSV


# ----------------------------------------------------------------------------- a replay run
@pytest.fixture
def database(pytester: pytest.Pytester) -> Path:
    """A database with good CSVs beside which a stand-in is put."""
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = pytester.path / "db"
    write_csv(db / "MatMulV2.csv", HEADER, MATMUL_ROWS)
    (db / "TransposeBatchMatMul.csv").write_bytes(REAL_CSV)
    return db


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` but the database lock (held, and left, by every writer)."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != ".perfdb.lock"
    }


@pytest.mark.parametrize("name", list(STAND_INS))
def test_a_replay_run_over_a_stand_in_fails_with_one_line_and_writes_nothing(
    pytester: pytest.Pytester, database: Path, name: str
) -> None:
    data, _, fix = STAND_INS[name]
    stand_in = database / "MatMulV3.csv"
    stand_in.write_bytes(data)
    before = snapshot(database)
    result = run(pytester, database)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"{stand_in}: {fix}"])
    output = result.stdout.str()
    assert "Traceback" not in output and "missing identity column" not in output
    assert output.count(fix) == 1
    assert "passed" not in output  # no case ran: the good CSVs are not measured without the rest
    assert snapshot(database) == before  # no write-back, no quarantine, no reports


def test_a_collect_only_run_fails_the_same_way(pytester: pytest.Pytester, database: Path) -> None:
    stand_in = database / "MatMulV3.csv"
    stand_in.write_bytes(lfs_pointer(REAL_CSV))
    result = run(pytester, database, "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"{stand_in}: {LFS_FIX}*"])


def test_a_database_not_pulled_is_one_line_naming_the_other_pointers(
    pytester: pytest.Pytester, database: Path
) -> None:
    for name in ("Add", "MatMulV3", "RmsNorm"):
        (database / f"{name}.csv").write_bytes(lfs_pointer(name.encode()))
    result = run(pytester, database)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [f"{database / 'Add.csv'}: {LFS_FIX}* 2 more file(s) here hold no CSV either (MatMulV3.csv, RmsNorm.csv)"]
    )


def test_a_text_file_that_is_no_kernel_csv_fails_the_run(pytester: pytest.Pytester, database: Path) -> None:
    # what a failed download saves under the CSV's name
    page = database / "MatMulV3.csv"
    page.write_text("<!DOCTYPE html>\n<html><head><title>Not Found</title></head></html>\n")
    result = run(pytester, database)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [f"{page}: is not a kernel CSV: its first line '<!DOCTYPE html>' names none of its columns (OP State, *"]
    )


# ----------------------------------------------------------------------------- perfdb
@pytest.mark.parametrize("name", list(STAND_INS))
def test_perfdb_ingest_into_a_stand_in_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    data, _, fix = STAND_INS[name]
    db = tmp_path / "db"
    db.mkdir()
    stand_in = db / "MatMulV3.csv"  # a kernel type the profile holds
    stand_in.write_bytes(data)
    profile = tmp_path / "kernel_details.csv"
    shutil.copy(ASCEND / "kernel_details_level2_llm_train.csv", profile)
    assert perfdb(["ingest", "--profiling-path", str(profile), "--database-path", str(db)]) == 2
    assert capsys.readouterr().err == f"perfdb ingest: error: {stand_in}: {fix}\n"
    assert snapshot(db) == {"MatMulV3.csv": data}


def test_perfdb_ingest_of_a_profile_left_as_a_pointer_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "kernel_details.csv"
    profile.write_bytes(lfs_pointer((ASCEND / "kernel_details_level1.csv").read_bytes()))
    assert perfdb(["ingest", "--profiling-path", str(profile), "--database-path", str(tmp_path / "db")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"perfdb ingest: error: {profile}: is a Git LFS pointer, not the CSV: "
        "run `git lfs pull` in the repository the profile came from"
    )
    assert not (tmp_path / "db").exists()


def test_perfdb_grid_over_a_pointer_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "db"
    db.mkdir()
    pointer = lfs_pointer(REAL_CSV)
    (db / "MatMulV2.csv").write_bytes(pointer)
    code = perfdb(["grid", "--data-dir", str(db), "--kernel-types", "MatMulV2", "--target-models", "qwen3-32b"])
    assert code == 2
    assert capsys.readouterr().err == f"perfdb grid: error: {db / 'MatMulV2.csv'}: {STAND_INS['lfs-pointer'][2]}\n"
    assert (db / "MatMulV2.csv").read_bytes() == pointer


COMM_CSV = b"message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps\n1024,2,DT_BF16,1,10,0.1\n"


@pytest.mark.parametrize("name", list(STAND_INS))
def test_perfdb_validate_comm_over_a_stand_in_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    data, _, fix = STAND_INS[name]
    baseline, candidate = tmp_path / "baseline", tmp_path / "candidate"
    for directory in (baseline, candidate):
        directory.mkdir()
        (directory / "hcom_allReduce_.csv").write_bytes(COMM_CSV)
    stand_in = candidate / "hcom_allGather_.csv"
    stand_in.write_bytes(data)
    assert perfdb(["validate-comm", str(baseline), str(candidate)]) == 2
    assert capsys.readouterr().err.startswith(f"perfdb validate-comm: error: {stand_in}: {fix}")


def test_perfdb_validate_comm_names_a_text_file_that_is_no_collective_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = tmp_path / "hcom_allReduce_.csv"
    baseline.write_bytes(COMM_CSV)
    candidate = tmp_path / "hcom_allReduce_candidate.csv"
    candidate.write_text('{"traceEvents": []}\n')
    assert perfdb(["validate-comm", str(baseline), str(candidate)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"perfdb validate-comm: error: {candidate}: is not a collective CSV: its first line")


# ----------------------------------------------------------------------------- the collective writer
def measured_all_reduce() -> CommResult:
    case = CommCase(COLLECTIVES["all_reduce"], 2, parse_dtype("bf16"), 1024, 1)
    return CommResult(case, (10.0, 20.0), "kernel", "gloo", 2, "2026-01-01T00:00:00Z")


def test_a_measured_collective_is_not_written_over_a_pointer(tmp_path: Path) -> None:
    path = tmp_path / "hcom_allReduce_.csv"
    pointer = lfs_pointer(COMM_CSV)
    path.write_bytes(pointer)
    with pytest.raises(UnusableFile, match="git lfs pull"):
        upsert_result(tmp_path, measured_all_reduce())
    assert path.read_bytes() == pointer


def test_an_empty_collective_file_is_written_anew(tmp_path: Path) -> None:
    # nothing in it to keep, and the result in hand was measured: refusing would lose it
    path = tmp_path / "hcom_allReduce_.csv"
    path.write_bytes(b"")
    assert upsert_result(tmp_path, measured_all_reduce()) == path
    assert path.read_text().startswith("message_bytes,num_devices,")
