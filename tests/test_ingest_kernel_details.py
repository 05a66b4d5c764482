"""Ingest of real torch_npu kernel_details files: aggregation, communication, Level0, names.

Expected values are computed here, independently, with the csv and statistics modules from the
real fixture files; the ingest output is read back with the csv module.
"""

from __future__ import annotations

import csv
import statistics
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import format_number
from perf_plugin.ingest.names import is_communication, normalise_kernel_type
from perf_plugin.ingest.pipeline import ingest_path

ASCEND = Path(__file__).parent / "fixtures" / "ascend"
LEVEL2 = ASCEND / "kernel_details_level2_llm_train.csv"
LEVEL1 = ASCEND / "kernel_details_level1.csv"
LEVEL0 = ASCEND / "kernel_details_level0.csv"
KEY = ("Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types")
MISSING = {"N/A", ""}


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def comm(row: dict[str, str]) -> bool:
    return (
        row["Type"].startswith("hcom_")
        or row["Name"].startswith("hcom_")
        or row["Accelerator Core"] in ("COMMUNICATION", "HCCL")
    )


def expected_groups(path: Path) -> dict[tuple[str, ...], list[dict[str, str]]]:
    groups: dict[tuple[str, ...], list[dict[str, str]]] = defaultdict(list)
    for row in read_rows(path):
        if not comm(row):
            groups[(row["Type"], *(row[c] for c in KEY))].append(row)
    return groups


def fmt(value: float) -> str:
    return format_number(value, 6)


def counter_mean(rows: list[dict[str, str]], counter: str) -> str:
    values = [float(r[counter]) for r in rows if r[counter] not in MISSING]
    return fmt(statistics.fmean(values)) if values else ""


def database_row(directory: Path, kernel_type: str, cells: dict[str, str]) -> dict[str, str]:
    matches = [r for r in read_rows(directory / f"{kernel_type}.csv") if all(r[c] == cells[c] for c in KEY)]
    assert len(matches) == 1, (kernel_type, cells)
    return matches[0]


@pytest.fixture(scope="module")
def level2_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("level2")
    ingest_path(LEVEL2, directory)
    return directory


@pytest.fixture(scope="module")
def level1_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("level1")
    ingest_path(LEVEL1, directory)
    return directory


@pytest.mark.parametrize("kernel_type", ["MatMulV3", "RmsNorm", "SwiGlu", "FlashAttentionScore", "Cast"])
def test_level2_statistics_match_independent_computation(level2_db: Path, kernel_type: str) -> None:
    groups = {k: v for k, v in expected_groups(LEVEL2).items() if k[0] == kernel_type}
    assert groups
    written = read_rows(level2_db / f"{kernel_type}.csv")
    assert len(written) == len(groups)
    for key, rows in groups.items():
        durations = [float(r["Duration(us)"]) for r in rows]
        row = database_row(level2_db, kernel_type, dict(zip(KEY, key[1:])))
        assert row["Profiling Count"] == str(len(rows))
        assert row["Profiling Average Duration(us)"] == fmt(statistics.fmean(durations))
        assert row["Profiling Median Duration(us)"] == fmt(statistics.median(durations))
        assert row["Profiling Std Duration(us)"] == (fmt(statistics.stdev(durations)) if len(rows) > 1 else "")
        for counter in ("aicore_time(us)", "aic_total_cycles", "aiv_time(us)", "cube_utilization(%)"):
            assert row[f"Profiling Average {counter}"] == counter_mean(rows, counter)
        first = rows[0]
        for column in ("OP State", "Accelerator Core", "Output Formats"):
            assert row[column] == first[column]


def test_level2_swiglu_values(level2_db: Path) -> None:
    # One group of 28 samples: the aggregate is checked against the file's own column.
    rows = [r for r in read_rows(LEVEL2) if r["Type"] == "SwiGlu"]
    (written,) = read_rows(level2_db / "SwiGlu.csv")
    assert written["Profiling Count"] == str(len(rows)) == "28"
    assert float(written["Profiling Average Duration(us)"]) == pytest.approx(
        sum(float(r["Duration(us)"]) for r in rows) / len(rows), abs=5e-7
    )


@pytest.mark.parametrize("kernel_type", ["Conv2D", "MatMulV2", "TransData", "DSAGenBitMask"])
def test_level1_statistics_match_independent_computation(level1_db: Path, kernel_type: str) -> None:
    groups = {k: v for k, v in expected_groups(LEVEL1).items() if k[0] == kernel_type}
    assert groups
    for key, rows in groups.items():
        durations = [float(r["Duration(us)"]) for r in rows]
        row = database_row(level1_db, kernel_type, dict(zip(KEY, key[1:])))
        assert row["Profiling Count"] == str(len(rows))
        assert row["Profiling Average Duration(us)"] == fmt(statistics.fmean(durations))
        assert row["Profiling Median Duration(us)"] == fmt(statistics.median(durations))
        # N/A counters (DSAGenBitMask has no AI Core counters) are skipped, not read as zero
        assert row["Profiling Average aicore_time(us)"] == counter_mean(rows, "aicore_time(us)")
        assert row["Profiling Average aic_mac_ratio"] == counter_mean(rows, "aic_mac_ratio")


def test_dtype_is_part_of_the_key(level1_db: Path) -> None:
    # The real CNN step runs Cast on shape 32 as BOOL->FLOAT and as INT64->INT32: two kernels.
    casts = [r for r in read_rows(level1_db / "Cast.csv") if r["Input Shapes"] == '"32"']
    assert sorted((r["Input Data Types"], r["Output Data Types"]) for r in casts) == [
        ("BOOL", "FLOAT"),
        ("INT64", "INT32"),
    ]


def test_schema_column_order_and_quoting(level2_db: Path) -> None:
    text = (level2_db / "MatMulV3.csv").read_text(encoding="utf-8")
    header = text.splitlines()[0].split(",")
    assert header[:8] == [
        "OP State",
        "Accelerator Core",
        "Input Shapes",
        "Input Data Types",
        "Input Formats",
        "Output Shapes",
        "Output Data Types",
        "Output Formats",
    ]
    assert header[8:11] == [
        "Profiling Average Duration(us)",
        "Profiling Median Duration(us)",
        "Profiling Std Duration(us)",
    ]
    source_header = LEVEL2.read_text(encoding="utf-8").splitlines()[0].split(",")
    counters = source_header[source_header.index("Context ID") + 1 :]
    assert header[11:-1] == [f"Profiling Average {c}" for c in counters]
    assert header[-1] == "Profiling Count"
    # shape cells keep the profiler's embedded-quote form
    assert '"""4096,1024;6144,1024"""' in text


def test_communication_rows_are_excluded_and_reported(level2_db: Path) -> None:
    expected = Counter(r["Type"] for r in read_rows(LEVEL2) if comm(r))
    assert expected == {"hcom_allReduce_": 7, "hcom_batchSendRecv_": 3, "hcom_allGather_": 3, "hcom_reduceScatter_": 2}
    report = ingest_path(LEVEL2, None)
    assert report.communication == expected
    assert report.table.compute_rows == len(read_rows(LEVEL2)) - sum(expected.values())
    assert not list(level2_db.glob("hcom_*"))
    assert any("hcom_allReduce_ x7" in line for line in report.lines())


def test_hccl_core_rows_of_the_older_generation(level1_db: Path) -> None:
    report = ingest_path(LEVEL1, None)
    assert report.communication == Counter({"hcom_allReduce_": 4})
    assert not (level1_db / "hcom_allReduce_.csv").exists()


def test_level0_file_is_refused_with_the_profiler_setting() -> None:
    with pytest.raises(DatabaseError) as info:
        ingest_path(LEVEL0, None)
    error = info.value
    assert error.path == LEVEL0
    message = str(error)
    for column in ("OP State", "Input Shapes", "Output Data Types", "Context ID"):
        assert repr(column) in message
    assert "ProfilerLevel.Level1" in message and "AiCMetrics.PipeUtilization" in message


def test_both_header_generations(tmp_path: Path) -> None:
    # Older releases: no Step Id / Device_id, Block Dim; newer: Block Num.  Same result.
    rows = read_rows(LEVEL2)
    header = list(rows[0])
    renamed = ["Block Num" if h == "Block Dim" else "Mix Block Num" if h == "Mix Block Dim" else h for h in header]
    renamed = [h for h in renamed if h not in ("Step Id", "Device_id")]
    path = tmp_path / "kernel_details.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(renamed)
        for row in rows:
            values = dict(row)
            values["Block Num"], values["Mix Block Num"] = values.pop("Block Dim"), values.pop("Mix Block Dim")
            writer.writerow([values[h] for h in renamed])
    assert ingest_path(path, None).rows == ingest_path(LEVEL2, None).rows


def test_variant_names_are_normalised(tmp_path: Path) -> None:
    source = [r for r in read_rows(LEVEL2) if r["Type"] == "Muls"]
    header = list(source[0])
    path = tmp_path / "kernel_details_variants.csv"
    names = ["split_qkv_rmsnorm_rope_kernel_0", "split_qkv_rmsnorm_rope_kernel_1", "reshape_and_cache_200000000"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for i, row in enumerate(source + source):
            writer.writerow([names[i % 3] if h == "Type" else row[h] for h in header])
    report = ingest_path(path, tmp_path / "db")
    assert sorted(report.kernel_types) == ["reshape_and_cache_200000000", "split_qkv_rmsnorm_rope_kernel"]
    (merged,) = read_rows(tmp_path / "db" / "split_qkv_rmsnorm_rope_kernel.csv")
    assert merged["Profiling Count"] == str(sum(1 for i in range(len(source) * 2) if i % 3 != 2))


def test_names_rules() -> None:
    assert normalise_kernel_type("split_qkv_rmsnorm_rope_kernel_0") == "split_qkv_rmsnorm_rope_kernel"
    assert normalise_kernel_type("muls_add_kernel_1") == "muls_add_kernel"
    for kept in ("reshape_and_cache_200000000", "mla_preprocess_0_mix_aic", "Conv2D1", "MatMulV3", "_triton_rope_1"):
        assert normalise_kernel_type(kept) == kept
    assert is_communication("hcom_allReduce_")
    assert is_communication("", name="hcom_batchSendRecv__128_3_1")
    assert is_communication("X", accelerator_core="HCCL")
    assert not is_communication("MatMulV3", "aclnnMm_MatMulCommon_MatMulV3", "AI_CORE")


def test_bad_number_names_row_and_column(tmp_path: Path) -> None:
    rows = read_rows(LEVEL1)
    header = list(rows[0])
    rows[4]["aiv_time(us)"] = "fast"  # the record on line 6 (header is line 1)
    path = tmp_path / "kernel_details.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\r\n")
        writer.writerow(header)
        writer.writerows([row[h] for h in header] for row in rows)
    with pytest.raises(DatabaseError) as info:
        ingest_path(path, None)
    assert (info.value.path, info.value.row, info.value.column) == (path, 6, "aiv_time(us)")
    assert "'fast' is not a number" in str(info.value)


def test_invalid_kernel_type_aborts_before_writing(tmp_path: Path) -> None:
    rows = read_rows(LEVEL1)[:3]
    header = list(rows[0])
    path = tmp_path / "kernel_details.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for i, row in enumerate(rows):
            writer.writerow(["../escape" if (h == "Type" and i == 2) else row[h] for h in header])
    with pytest.raises(DatabaseError, match="not a plain name"):
        ingest_path(path, tmp_path / "db")
    assert not (tmp_path / "db").exists()
