"""``perfdb lookup`` and ``perf_plugin.lookup``: answers from the real Level2 profile's rows,
exact or interpolated along one GEMM dimension, never extrapolated."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from perf_plugin.cli import main as perfdb
from perf_plugin.database.table import CsvTable
from perf_plugin.lookup import Query, lookup
from perf_plugin.lookup.command import make_query
from tests.conftest import ASCEND

V3 = "MatMulV3"


@pytest.fixture(scope="module")
def database(level2_database: Path) -> Path:
    return level2_database


def gemm(shapes: str, dtypes: str = "DT_BF16;DT_BF16", kernel_type: str = V3) -> Query:
    return make_query({"Kernel Type": kernel_type, "Input Shapes": shapes, "Input Data Types": dtypes})


def profiled(db: Path, kernel_type: str, shapes: str) -> tuple[int, float]:
    with (db / f"{kernel_type}.csv").open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            if row["Input Shapes"].strip('"') == shapes:
                return line, float(row["Profiling Average Duration(us)"])
    raise AssertionError(shapes)


def test_an_exact_row_answers_with_its_profiled_average(database: Path) -> None:
    line, average = profiled(database, V3, "4096,1024;6144,1024")
    answer = lookup(database, gemm('"4096,1024;6144,1024"', "BF16;BF16"))  # either dtype spelling
    assert (answer.provenance, answer.duration_us, answer.rows) == ("exact", average, (line,))
    assert answer.column == "Profiling Average Duration(us)"


def test_a_measured_average_comes_before_the_profiled_one(database: Path, tmp_path: Path) -> None:
    import shutil

    db = tmp_path / "db"
    shutil.copytree(database, db)
    table = CsvTable.read(db / f"{V3}.csv")
    table.insert_column("Average Duration(us)", 8)
    line, _ = profiled(db, V3, "4096,1024;6144,1024")
    table.set(line - 2, "Average Duration(us)", "250.5")
    table.write(db / f"{V3}.csv")
    answer = lookup(db, gemm("4096,1024;6144,1024"))
    assert (answer.duration_us, answer.column) == (250.5, "Average Duration(us)")


def test_between_two_rows_the_efficiency_is_interpolated(database: Path) -> None:
    low_line, low = profiled(database, V3, "4096,1024;4096,1024")
    high_line, high = profiled(database, V3, "4096,1024;6144,1024")
    answer = lookup(database, gemm("4096,1024;5120,1024"))
    assert answer.provenance == "interpolated" and set(answer.rows) == {low_line, high_line}
    assert answer.column == "GEMM efficiency against work, linear in N between 4096 and 6144 (log axes, log efficiency)"
    assert answer.duration_us is not None and low < answer.duration_us < high
    # the efficiency at N=5120 lies between the two measured ones
    efficiencies = [2 * 4096 * n * 1024 / t for n, t in ((4096, low), (6144, high))]
    assert min(efficiencies) <= 2 * 4096 * 5120 * 1024 / answer.duration_us <= max(efficiencies)


def test_outside_the_measured_hull_the_nearest_rows_efficiency_is_held_and_the_reason_says_so(database: Path) -> None:
    answer = lookup(database, gemm("4096,1024;16384,1024"))
    assert answer.provenance == "fallback" and len(answer.rows) == 1
    assert answer.reason.startswith("outside the measured hull: M in [") and "; N in [" in answer.reason
    assert "of the nearest measured row (M 4096, N 6144, K 1024), held" in answer.column
    line, measured = profiled(database, V3, "4096,1024;6144,1024")
    assert answer.rows == (line,)
    assert answer.duration_us == pytest.approx(measured * 16384 / 6144)  # the same operations per microsecond


def test_other_dtypes_or_kernel_types_say_why(database: Path) -> None:
    assert "fewer than two measured rows of these dtypes" in lookup(database, gemm("4096,1024;5120,1024", "FLOAT;FLOAT")).reason
    gather = make_query({"Kernel Type": "GatherV2", "Input Shapes": '"3,3;3"', "Input Data Types": "FLOAT;INT64"})
    assert lookup(database, gather).reason == "no row of GatherV2.csv has these inputs, and GatherV2 has no interpolation"
    norm = make_query({"Kernel Type": "RmsNorm", "Input Shapes": '"3,3;3"', "Input Data Types": "DOUBLE;DOUBLE"})
    assert lookup(database, norm).reason == "fewer than two measured rows with these input ranks, dtypes and shapes' relations"


def test_the_command_answers_one_query_and_a_csv_of_them(database: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert perfdb(["lookup", "--database-path", str(database), "--kernel-type", V3,
                   "--input-shapes", "4096,1024;5120,1024", "--input-dtypes", "DT_BF16;DT_BF16"]) == 0
    assert "(interpolated: row" in capsys.readouterr().out
    queries = tmp_path / "queries.csv"
    queries.write_text("Kernel Type,Input Shapes,Input Data Types\n"
                       f'{V3},"4096,1024;6144,1024",DT_BF16;DT_BF16\n'
                       f'{V3},"4096,1024;16384,1024",DT_BF16;DT_BF16\n')
    out = tmp_path / "answers.csv"
    assert perfdb(["lookup", "--database-path", str(database), "--queries", str(queries), "--out", str(out)]) == 0
    with out.open(newline="") as handle:
        answers = list(csv.DictReader(handle))
    assert [a["Provenance"] for a in answers] == ["exact", "fallback"]
    assert answers[1]["Reason"].startswith("outside the measured hull")


def test_a_bad_query_is_one_error_naming_file_row_and_column(database: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    queries = tmp_path / "queries.csv"
    queries.write_text(f'Kernel Type,Input Shapes,Input Data Types\n{V3},"4096,x",DT_BF16\n')
    assert perfdb(["lookup", "--database-path", str(database), "--queries", str(queries), "--out", str(tmp_path / "a.csv")]) == 2
    error = capsys.readouterr().err
    assert str(queries) in error and "row 2" in error and "Input Shapes" in error


def test_a_streaming_kernel_is_interpolated_by_its_efficiency(database: Path) -> None:
    """The real Level2 Mul rows of a tensor times a 0-d scalar: 4194304 and 6291456 floats."""
    import math

    low_line, low = profiled(database, "Mul", "4194304;")
    high_line, high = profiled(database, "Mul", "6291456;")
    query = make_query({"Kernel Type": "Mul", "Input Shapes": '"5242880;"', "Input Data Types": "FLOAT;FLOAT"})
    answer = lookup(database, query)
    assert answer.provenance == "interpolated" and set(answer.rows) == {low_line, high_line}
    # no peaks file: bytes moved (read, and written as much) per microsecond, its log linear in log width
    moved = [8 * n for n in (4194304, 5242880, 6291456)]
    share = math.log(5242880 / 4194304) / math.log(6291456 / 4194304)
    log_efficiency = math.log(moved[0] / low) + share * (math.log(moved[2] / high) - math.log(moved[0] / low))
    assert answer.duration_us == pytest.approx(moved[1] / math.exp(log_efficiency))
    assert answer.column == "streaming efficiency against work, linear in bytes between 33554432 and 50331648 " \
                            "(log axes, log efficiency)"
    huge = make_query({"Kernel Type": "Mul", "Input Shapes": '"999999999;"', "Input Data Types": "FLOAT;FLOAT"})
    far = lookup(database, huge)
    assert far.provenance == "fallback" and far.reason.startswith("outside the measured hull: bytes in [")


def test_the_command_gives_the_policy_answer_beside_its_own(database: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    mapping = ASCEND / "op_mapping_vllm0.18.0_torch2.9.0_cann8.5.yaml"
    assert perfdb(["lookup", "--database-path", str(database), "--kernel-type", V3, "--input-shapes",
                   "4096,1024;5120,1024", "--input-dtypes", "DT_BF16;DT_BF16", "--policy", "--op-mapping", str(mapping)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{V3}: ") and "(interpolated:" in lines[0]
    assert lines[1].startswith(f"policy: {V3}: ") and "policy max_interpolation_dim 1: linear in N" in lines[1]
    queries = tmp_path / "queries.csv"
    queries.write_text(f'Kernel Type,Input Shapes,Input Data Types\n{V3},"4096,1024;5120,1024",DT_BF16;DT_BF16\n')
    out = tmp_path / "answers.csv"
    assert perfdb(["lookup", "--database-path", str(database), "--queries", str(queries), "--out", str(out),
                   "--policy", "--op-mapping", str(mapping)]) == 0
    with out.open(newline="") as handle:
        (answer,) = list(csv.DictReader(handle))
    assert answer["Provenance"] == answer["Policy Provenance"] == "interpolated"
    # the policy interpolates the latency itself, this project the efficiency: both between the rows
    assert float(answer["Policy Duration(us)"]) != float(answer["Duration(us)"])


def test_the_command_finds_a_derived_database_as_a_run_derives_it(database: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    derived = tmp_path / "root" / "NVIDIA_H100_80GB_HBM3" / "torch" / "torch2.11.0_cuda13.0"
    shutil.copytree(database, derived)
    assert perfdb(["lookup", "--database-root", str(tmp_path / "root"), "--device", "NVIDIA_H100_80GB_HBM3",
                   "--torch-version", "2.11.0", "--cuda-version", "13.0", "--kernel-type", V3,
                   "--input-shapes", "4096,1024;6144,1024", "--input-dtypes", "DT_BF16;DT_BF16"]) == 0
    assert "(exact: row" in capsys.readouterr().out
