"""The kernel CSVs write-back produces, read the way the Ascend performance model reads them.

docs/ascend-reader-contract.md is the contract; ``tests/ascend_reader.py`` re-implements the
reader's compute lookup (msmodeling's ``ProfilingDataSource``: Ascend/msmodeling,
``tensor_cast/performance_model/profiling_database/profiling_data_source.py``, three versions).
The tests write a database as a user does (the real Level2 profile ingested, a real msmodeling
database file, then a real ``pytest bench`` write-back), put the real ``op_mapping.yaml`` beside
it, and ask the reader for every row by the inputs a model operator would pass: each version
must find that row, at the mean of its timed repeats, and every other statistic must be in the
column whose name says it.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from perf_plugin.cli import main as perfdb
from perf_plugin.database.schema import (
    DURATION_PREFERENCE,
    MICROBENCH_AVERAGE,
    MICROBENCH_SAMPLES,
    MICROBENCH_STATISTICS,
    PROFILING_AVERAGE,
    format_number,
    microbench_counter_column,
    profiling_counter_column,
    written_column_meanings,
)
from tests.ascend_reader import (
    GENERATIONS,
    LATENCY_COLUMNS,
    AscendReader,
    Hit,
    query_of,
)
from tests.conftest import ASCEND
from tests.test_msprof import (
    counter_mean,
    counter_names,
    durations,
    launches,
    write_prof,
)
from tests.test_plugin import _profiler_modules_loaded  # noqa: F401  (torch.profiler's lazy imports, before pytester)

BENCH_TEST = (Path(__file__).parents[1] / "bench" / "test_kernels.py").read_text()
OP_MAPPING = ASCEND / "op_mapping_vllm0.18.0_torch2.9.0_cann8.5.yaml"
CONTRACT = Path(__file__).parents[1] / "docs" / "ascend-reader-contract.md"
# The model operator that the real op_mapping.yaml sends to each kernel type's CSV.
OPERATOR = {
    "RmsNorm": "tensor_cast.rms_norm.default",
    "ConcatD": "aten.cat.default",
    "MatMulV2": "aten.mm.default",
    "MatMulV3": "aten.mm.default",
    "TransposeBatchMatMul": "aten.bmm.default",
}
# Where the run report gives each statistic of a case (``results[].stats``).
REPORT_STAT = {"mean": "mean_us", "median": "median_us", "minimum": "min_us", "std": "std_us", "count": "count"}

Measured = dict[tuple[str, int], dict[str, Any]]  # (csv file, row position) -> the report's case entry


# ----------------------------------------------------------------------------- building databases
def _database(root: Path, ingested_types: tuple[str, ...], msmodeling_files: dict[str, str] | None = None) -> Path:
    """The real Level2 profile ingested (its CSVs of ``ingested_types`` kept), real msmodeling
    database files copied in as ``{KernelType}.csv``, and the real op_mapping.yaml beside them."""
    profile = root / "kernel_details.csv"
    shutil.copy(ASCEND / "kernel_details_level2_llm_train.csv", profile)
    ingested = root / "ingested"
    assert perfdb(["ingest", "--profiling-path", str(profile), "--database-path", str(ingested)]) == 0
    db = root / "db"
    db.mkdir()
    for kernel_type in ingested_types:
        shutil.copy(ingested / f"{kernel_type}.csv", db)
    for kernel_type, fixture in (msmodeling_files or {}).items():
        shutil.copy(ASCEND / fixture, db / f"{kernel_type}.csv")
    shutil.copy(OP_MAPPING, db / "op_mapping.yaml")
    return db


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _header(path: Path) -> list[str]:
    with path.open(newline="") as handle:
        return next(csv.reader(handle))


def _report(db: Path) -> dict[str, Any]:
    (path,) = (db / "reports").glob("run_report_*.json")
    report: dict[str, Any] = json.loads(path.read_text())
    return report


def _measured(db: Path, report: dict[str, Any]) -> Measured:
    """Each measured case's row: its ``row_line`` (1-based, the header first), or, for a
    measurement no row produced, the row write-back appended (``Row Origin`` ``measured:...``)."""
    measured: Measured = {}
    for entry in report["results"]:
        if entry["stats"] is None:
            continue
        reported = entry["reported_kernel_type"]
        csv_file = f"{reported}.csv" if reported else entry["csv_file"]
        if entry["row_line"] is not None:
            measured[(csv_file, entry["row_line"] - 2)] = entry
        else:
            (appended,) = [
                i for i, row in enumerate(_rows(db / csv_file)) if row.get("Row Origin", "").startswith("measured:")
            ]
            measured[(csv_file, appended)] = entry
    return measured


# ----------------------------------------------------------------------------- what the files must say
def _assert_each_statistic_in_its_column(db: Path, measured: Measured) -> None:
    for (csv_file, position), entry in measured.items():
        row = _rows(db / csv_file)[position]
        for column, statistic in MICROBENCH_STATISTICS.items():
            expected = format_number(entry["stats"][REPORT_STAT[statistic]])
            assert row[column] == expected, f"{csv_file} row {position + 2}, {column}"


def _assert_reader_finds_every_row(db: Path, measured: Measured, unmeasured: frozenset[tuple[str, int]]) -> None:
    """Every row of every CSV of the directory, asked for by its own inputs, is found -- itself,
    not an earlier row -- at ``Average Duration(us)``, the mean, under each reader version."""
    for generation in GENERATIONS:
        reader = AscendReader(db, generation)
        for path in sorted(db.glob("*.csv")):
            frame = pd.read_csv(path)
            for position in range(len(frame)):
                if (path.name, position) in unmeasured:
                    continue
                where = f"{generation.name}: {path.name} row {position + 2}"
                entry = measured.get((path.name, position))
                assert entry is not None, f"{where}: the run did not measure this row"
                hit = reader.lookup(OPERATOR[path.stem], query_of(frame.iloc[position]))
                mean = float(format_number(entry["stats"]["mean_us"]))
                assert hit == Hit(path.stem, position, MICROBENCH_AVERAGE, mean), f"{where}: {hit}"


# ----------------------------------------------------------------------------- tests
def test_the_reader_model_reads_a_real_msmodeling_database_file(tmp_path: Path) -> None:
    """The re-implementation against a file of msmodeling's own tests, before anything writes to it."""
    shutil.copy(ASCEND / "db_row_TransposeBatchMatMul.csv", tmp_path / "TransposeBatchMatMul.csv")
    shutil.copy(OP_MAPPING, tmp_path / "op_mapping.yaml")
    bf16 = torch.bfloat16
    for generation in GENERATIONS:
        reader = AscendReader(tmp_path, generation)
        first = reader.lookup("aten.bmm.default", [((4, 16, 128), bf16), ((16, 128, 512), bf16)])
        second = reader.lookup("aten.bmm.default", [((4, 16, 512), bf16), ((16, 512, 128), bf16)])
        assert first == Hit("TransposeBatchMatMul", 0, MICROBENCH_AVERAGE, 15.0), generation.name
        assert second == Hit("TransposeBatchMatMul", 1, MICROBENCH_AVERAGE, 12.0), generation.name
        assert reader.lookup("aten.bmm.default", [((4, 16, 128), torch.float32), ((16, 128, 512), torch.float32)]) is None


def test_the_project_prefers_the_duration_columns_in_the_readers_order() -> None:
    assert DURATION_PREFERENCE == LATENCY_COLUMNS


def test_replayed_rows_are_found_at_their_mean_with_each_statistic_in_its_column(pytester: pytest.Pytester) -> None:
    db = _database(pytester.path, ("RmsNorm", "ConcatD"), {"TransposeBatchMatMul": "db_row_TransposeBatchMatMul.csv"})
    op_mapping = (db / "op_mapping.yaml").read_bytes()
    pytester.makepyfile(test_kernels=BENCH_TEST)
    result = pytester.runpytest(
        "--perf-database-path", str(db), "--perf-repeat-count", "5", "--perf-warmup-count", "1",
        "-p", "no:cacheprovider", "-k", "not (RmsNorm and 4096x1x8x128)",  # one row left unmeasured
    )
    result.assert_outcomes(passed=6, deselected=1)

    report = _report(db)
    measured = _measured(db, report)
    assert len(measured) == 6
    _assert_each_statistic_in_its_column(db, measured)
    assert report["columns"] == written_column_meanings()
    assert (db / "op_mapping.yaml").read_bytes() == op_mapping  # the reader's file: never written here
    # msmodeling's own rows had Average Duration(us) (its writer's minimum of all launches) and no
    # MicroBench Samples; measured here, they say by that cell that the value is now the mean
    assert all(row[MICROBENCH_SAMPLES] == "5" for row in _rows(db / "TransposeBatchMatMul.csv"))

    (unmeasured,) = [i for i, r in enumerate(_rows(db / "RmsNorm.csv")) if r["Input Shapes"].startswith('"4096,1,8,128;')]
    _assert_reader_finds_every_row(db, measured, unmeasured=frozenset({("RmsNorm.csv", unmeasured)}))

    # The unmeasured row keeps an empty Average Duration(us) cell: readers from 1293ea5 on take its
    # profiled average instead; 8a2288d reads the file's first column on every row, NaN here.
    row = _rows(db / "RmsNorm.csv")[unmeasured]
    assert row[MICROBENCH_AVERAGE] == ""
    query = query_of(pd.read_csv(db / "RmsNorm.csv").iloc[unmeasured])
    for generation in GENERATIONS:
        hit = AscendReader(db, generation).lookup(OPERATOR["RmsNorm"], query)
        assert hit is not None and (hit.kernel_type, hit.row) == ("RmsNorm", unmeasured), generation.name
        if generation.per_row_fallback:
            assert (hit.column, hit.latency_us) == (PROFILING_AVERAGE, float(row[PROFILING_AVERAGE])), generation.name
        else:
            assert hit.column == MICROBENCH_AVERAGE and math.isnan(hit.latency_us), generation.name


def test_npu_measurements_put_each_counter_beside_its_profiled_one_and_are_found(pytester: pytest.Pytester) -> None:
    """A profile read with --perf-prof-path (the NPU path, no device needed): MicroBench counters."""
    db = _database(pytester.path, ("MatMulV3", "RmsNorm"))
    prof = write_prof(pytester.path / "msprof")
    pytester.makepyfile(test_kernels=BENCH_TEST)
    result = pytester.runpytest(
        "--perf-database-path", str(db), "--perf-prof-path", str(prof), "--perf-repeat-count", "25",
        "--perf-warmup-count", "2", "-p", "no:cacheprovider",
    )
    assert result.ret == 0

    report = _report(db)
    measured = _measured(db, report)
    # 10 MatMulV3 rows, 3 RmsNorm rows, and a MatMulV2 kernel of the profile appended to a new MatMulV2.csv
    assert sorted({csv_file for csv_file, _ in measured}) == ["MatMulV2.csv", "MatMulV3.csv", "RmsNorm.csv"]
    assert len(measured) == 14
    _assert_each_statistic_in_its_column(db, measured)

    profiled_counters = set(counter_names())
    for (csv_file, position), entry in measured.items():
        header, row = _header(db / csv_file), _rows(db / csv_file)[position]
        assert {"aicore_time(us)", "aiv_time(us)"} <= set(entry["counters"]) <= profiled_counters
        for counter, value in entry["counters"].items():
            column = microbench_counter_column(counter)
            assert row[column] == format_number(value), (csv_file, position, column)
            if profiling_counter_column(counter) in header:  # beside the profiled counter, just before it
                assert header.index(column) == header.index(profiling_counter_column(counter)) - 1, column
    for csv_file in ("MatMulV3.csv", "RmsNorm.csv"):  # ingested files: every profiled counter has its partner
        header = _header(db / csv_file)
        assert all(microbench_counter_column(c) in header for c in profiled_counters), csv_file

    # One row against the profile itself: its 28 launches, the first 1 + 2 (verification, warm-up) dropped.
    # (msmodeling's writer would store min(all 28 launches) in Average Duration(us).)
    kept = launches("RmsNorm", '"4096,1,16,128;128"', '"4096,1,16,128;4096,1,16,1"')
    assert len(kept) == 28
    kept = kept[3:]
    (row,) = [r for r in _rows(db / "RmsNorm.csv") if r["Input Shapes"].startswith('"4096,1,16,128;')]
    assert row[MICROBENCH_AVERAGE] == format_number(statistics.fmean(durations(kept)))
    assert row["MicroBench Min Duration(us)"] == format_number(min(durations(kept)))
    assert row["MicroBench Median Duration(us)"] == format_number(statistics.median(durations(kept)))
    assert row["MicroBench aiv_time(us)"] == format_number(counter_mean(kept, "aiv_time(us)"))

    _assert_reader_finds_every_row(db, measured, unmeasured=frozenset())


def test_the_contract_names_the_statistic_of_every_column_write_back_fills() -> None:
    text = CONTRACT.read_text(encoding="utf-8")
    documented = dict(re.findall(r"^\| `([^`]+)` \| `(mean|median|minimum|std|count)` \|", text, flags=re.MULTILINE))
    assert documented == MICROBENCH_STATISTICS
    assert all(f"`{column}`" in text for column in written_column_meanings())
