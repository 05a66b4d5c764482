"""The pytest plugin end to end, with pytester: cases, ids, selection, write-back, gate, quarantine."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from perf_plugin.database.signature import signature_text
from perf_plugin.replay.registry import signature_of

BENCH_TEST = (Path(__file__).parents[1] / "bench" / "test_kernels.py").read_text()
HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"

# Real-format rows (embedded-quote shapes, Ascend dtype spellings), small enough for fast tests.
MATMUL_ROWS = [
    'dynamic,AI_CORE,"""32,64;64,16""",FLOAT;FLOAT,ND;ND,"""32,16""",FLOAT,ND',
    'dynamic,AI_CORE,"""32,64;16,64""",DT_BF16;DT_BF16,ND;ND,"""32,16""",DT_BF16,ND',
]
ADD_ROWS = ['dynamic,AI_VECTOR_CORE,"""8,128;8,128""",FLOAT;DT_BF16,ND;ND,"""8,128""",FLOAT,ND']


def write_csv(path: Path, header: str, rows: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module", autouse=True)
def _profiler_modules_loaded() -> None:
    """Import what a profiler session imports lazily, before pytester's in-process runs.

    pytester restores ``sys.modules`` after every in-process run; torch.profiler imports
    modules on first use (``torch._inductor`` among them) whose C++ state outlives them, so a
    second run would re-import them over live state.  Loading them once up front keeps them.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        torch.ones(1).add(1)


@pytest.fixture
def project(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = pytester.path / "db"
    write_csv(db / "MatMulV2.csv", HEADER, MATMUL_ROWS)
    write_csv(db / "Add.csv", HEADER, ADD_ROWS)
    return db


def run(pytester: pytest.Pytester, db: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest("--database-path", str(db), "--repeat-count", "3", "--warmup-count", "1", "-p", "no:cacheprovider", *args)


def test_one_case_per_row_with_readable_ids(pytester: pytest.Pytester, project: Path) -> None:
    result = run(pytester, project, "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "test_kernels.py::test_kernel_replay[Add-8x128,8x128-FLOAT,BF16-to-8x128-FLOAT]",
            "test_kernels.py::test_kernel_replay[MatMulV2-32x64,64x16-FLOAT-to-32x16-FLOAT]",
            "test_kernels.py::test_kernel_replay[MatMulV2-32x64,16x64-BF16-to-32x16-BF16]",
            "3 tests collected*",
        ]
    )
    assert result.ret == 0


def test_replay_cases_request_no_per_test_fixture_beyond_their_row(pytester: pytest.Pytester, project: Path) -> None:
    # perf_runner must not ask for pytestconfig or request: either would make pytest build a
    # fixture definition for ``request`` in every case (measured ~0.07 ms per case)
    items, _ = pytester.inline_genitems("--database-path", str(project), "-p", "no:cacheprovider")
    assert items and all(sorted(item.fixturenames) == ["kernel_case", "perf_runner"] for item in items)


def test_duplicate_rows_get_stable_suffixes(pytester: pytest.Pytester, project: Path) -> None:
    write_csv(project / "MatMulV2.csv", HEADER, [MATMUL_ROWS[0], MATMUL_ROWS[0]])
    result = run(pytester, project, "--collect-only", "-q", "-k", "MatMulV2")
    result.stdout.fnmatch_lines(["*[[]MatMulV2-32x64,64x16-FLOAT-to-32x16-FLOAT[]]", "*[[]MatMulV2-32x64,64x16-FLOAT-to-32x16-FLOAT#2[]]"])


def test_run_writes_durations_back_and_reports(pytester: pytest.Pytester, project: Path) -> None:
    result = run(pytester, project)
    result.assert_outcomes(passed=3, warnings=0)  # nothing deprecated in the plugin's own fixtures
    rows = read_rows(project / "MatMulV2.csv")
    assert [r["MicroBench Samples"] for r in rows] == ["3", "3"]
    for row in rows:
        assert float(row["Average Duration(us)"]) > 0
        assert float(row["MicroBench Min Duration(us)"]) <= float(row["Average Duration(us)"])
        assert row["MicroBench Backend"] == "cpu"
        assert "aten::mm" in row["MicroBench Kernels"]
    header = next(csv.reader((project / "MatMulV2.csv").open()))
    assert header.index("Average Duration(us)") == 8  # after the identity columns
    reports = sorted(p.name.split("_")[0] for p in (project / "reports").iterdir())
    assert reports == ["duration", "replay", "run"]


class _KeptReports:
    """What the terminal reporter still holds at the end of a run, by category."""

    def __init__(self) -> None:
        self.kept: dict[str, list[tuple[str, str]]] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        self.kept = {key: [(r.nodeid, r.when) for r in reports] for key, reports in terminalreporter.stats.items()}


def test_a_run_keeps_only_the_reports_its_summary_reads(pytester: pytest.Pytester, project: Path) -> None:
    probe = _KeptReports()
    result = pytester.runpytest(
        "--database-path", str(project), "--repeat-count", "3", "--warmup-count", "1", "-p", "no:cacheprovider", "-rA",
        plugins=[probe],
    )
    result.assert_outcomes(passed=3)
    assert probe.kept.get("", []) == []  # the passed setup and teardown reports, let go
    assert sorted(when for _, when in probe.kept["passed"]) == ["call"] * 3
    result.stdout.fnmatch_lines(["PASSED test_kernels.py::test_kernel_replay[[]Add-*", "*3 passed*"])


def test_gap_report_names_each_measured_row_by_line_and_signature(pytester: pytest.Pytester, project: Path) -> None:
    header = HEADER + ",Average Duration(us)"
    # a blank line first: the rows' lines are 3 and 4, not their indices
    write_csv(project / "MatMulV2.csv", header, [",,,,,,,,", MATMUL_ROWS[0] + ",", MATMUL_ROWS[1] + ",7.5"])
    result = run(pytester, project, "-k", "MatMulV2")
    result.assert_outcomes(passed=2)
    expected = {
        (str(line), signature_text(signature_of("MatMulV2", row)))
        for line, row in enumerate(read_rows(project / "MatMulV2.csv"), start=2)
        if row["Input Shapes"]
    }
    (gap_file,) = (project / "reports").glob("duration_gap_*.csv")
    gaps = read_rows(gap_file)
    assert {(g["line"], g["signature"]) for g in gaps} == expected and len(expected) == 2
    assert {g["line"] for g in gaps} == {"3", "4"}


def test_k_selects_one_kernel_type_and_leaves_others_untouched(pytester: pytest.Pytester, project: Path) -> None:
    before = (project / "Add.csv").read_bytes()
    result = run(pytester, project, "-k", "MatMulV2")
    result.assert_outcomes(passed=2, deselected=1)
    assert (project / "Add.csv").read_bytes() == before
    assert all(r["Average Duration(us)"] for r in read_rows(project / "MatMulV2.csv"))


def test_missing_only_fills_only_rows_without_a_duration(pytester: pytest.Pytester, project: Path) -> None:
    header = HEADER + ",Average Duration(us)"
    write_csv(project / "MatMulV2.csv", header, [MATMUL_ROWS[0] + ",42.5", MATMUL_ROWS[1] + ","])
    result = run(pytester, project, "--update-mode", "missing-only", "-k", "MatMulV2")
    result.assert_outcomes(passed=1, skipped=1)
    rows = read_rows(project / "MatMulV2.csv")
    assert rows[0]["Average Duration(us)"] == "42.5"
    assert float(rows[1]["Average Duration(us)"]) > 0


def test_a_duration_cell_that_is_not_a_number_is_named_and_measured_again(pytester: pytest.Pytester, project: Path) -> None:
    header = HEADER + ",Average Duration(us)"
    write_csv(project / "MatMulV2.csv", header, [MATMUL_ROWS[0] + ",N/A", MATMUL_ROWS[1] + ",fast"])
    result = run(pytester, project, "--update-mode", "missing-only", "-k", "MatMulV2")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        f"{project / 'MatMulV2.csv'}, row 3, column 'Average Duration(us)': 'fast' is not a duration; such a row "
        "counts as having none and its duration is measured again"
    ])
    assert "'N/A'" not in result.stdout.str()  # the usual spelling of no value is not reported
    assert all(float(row["Average Duration(us)"]) > 0 for row in read_rows(project / "MatMulV2.csv"))


def test_cells_past_the_header_are_named_and_kept(pytester: pytest.Pytester, project: Path) -> None:
    path = write_csv(project / "MatMulV2.csv", HEADER, [MATMUL_ROWS[0] + ",stray,cells", MATMUL_ROWS[1] + ","])
    result = run(pytester, project, "-k", "MatMulV2")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        f"{path}, row 2: 10 cells for 8 header columns; the cells past the header belong to no column and are kept as they are"
    ])
    assert "row 3:" not in result.stdout.str()  # an empty trailing cell is no stray cell
    lines = path.read_text().splitlines()
    assert lines[1].endswith(",stray,cells") and float(read_rows(path)[0]["Average Duration(us)"]) > 0


def test_update_mode_all_overwrites_existing_durations(pytester: pytest.Pytester, project: Path) -> None:
    header = HEADER + ",Average Duration(us)"
    write_csv(project / "MatMulV2.csv", header, [MATMUL_ROWS[0] + ",42.5"])
    run(pytester, project, "-k", "MatMulV2").assert_outcomes(passed=1)
    assert read_rows(project / "MatMulV2.csv")[0]["Average Duration(us)"] != "42.5"


def test_no_writeback_leaves_the_database_as_it_was(pytester: pytest.Pytester, project: Path) -> None:
    before = (project / "MatMulV2.csv").read_bytes()
    run(pytester, project, "--no-writeback").assert_outcomes(passed=3)
    assert (project / "MatMulV2.csv").read_bytes() == before


def test_malformed_rows_are_set_aside_and_rows_the_replay_cannot_build_stay(
    pytester: pytest.Pytester, project: Path
) -> None:
    header = HEADER + ",Profiling Average Duration(us),Note"
    rows = [
        MATMUL_ROWS[0] + ",5.5,kept",
        'dynamic,AI_CORE,"""32,x;64,16""",FLOAT;FLOAT,ND;ND,"""32,16""",FLOAT,ND,7.5,malformed shape',
        'dynamic,AI_CORE,"""32,64;64,16""",DT_COMPLEX99;FLOAT,ND;ND,"""32,16""",FLOAT,ND,,unknown dtype',
        'dynamic,AI_CORE,"""32,64;65,16""",FLOAT;FLOAT,ND;ND,"""32,16""",FLOAT,ND,9.25,inconsistent',
    ]
    write_csv(project / "MatMulV2.csv", header, rows)
    result = run(pytester, project, "-k", "MatMulV2", "-rs")
    result.assert_outcomes(passed=1, skipped=3)
    result.stdout.fnmatch_lines(
        [
            "*MatMulV2.csv, row 3, column 'Input Shapes': malformed shape*",
            "*MatMulV2.csv, row 4, column 'Input Data Types': unknown dtype 'COMPLEX99'*",
            "*unsupported: *MatMulV2.csv, row 5: replay cannot be built*",
        ]
    )
    kept = read_rows(project / "MatMulV2.csv")
    # the row the replay cannot build keeps its place and its profiled duration, and gets none
    assert [(r["Note"], r["Profiling Average Duration(us)"]) for r in kept] == [("kept", "5.5"), ("inconsistent", "9.25")]
    assert float(kept[0]["Average Duration(us)"]) > 0 and kept[1]["Average Duration(us)"] == ""
    quarantine = read_rows(project / "MatMulV2.quarantine.csv")
    assert [q["Note"] for q in quarantine] == ["malformed shape", "unknown dtype"]
    assert quarantine[0]["Profiling Average Duration(us)"] == "7.5"  # every column set aside with the row
    assert "malformed shape" in quarantine[0]["Quarantine Reason"]


@pytest.mark.parametrize(
    ("header", "row", "message"),
    [
        ("OP State,Input Shapes", 'dynamic,"""8,8"""', "*Mul.csv, column 'Input Data Types': missing identity column*"),
        (
            HEADER + ",Input Shapes",
            ADD_ROWS[0] + ',"""8,8"""',
            "*Mul.csv, column 'Input Shapes': column named 2 times in the header; rows skipped, file left as it is",
        ),
    ],
    ids=["missing-identity-column", "duplicated-column"],
)
def test_file_with_a_bad_header_is_skipped_and_left_alone(
    pytester: pytest.Pytester, project: Path, header: str, row: str, message: str
) -> None:
    broken = write_csv(project / "Mul.csv", header, [row])
    before = broken.read_bytes()
    result = run(pytester, project, "-rs")
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines([message])
    assert broken.read_bytes() == before
    assert not (project / "Mul.quarantine.csv").exists()


def test_database_without_kernel_csvs_is_one_line_not_a_traceback(pytester: pytest.Pytester, project: Path) -> None:
    empty = pytester.path / "empty_db"
    empty.mkdir()
    result = run(pytester, empty)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"{empty}: database directory has no kernel CSVs"])
    assert "Traceback" not in result.stdout.str() and "plugin.py" not in result.stdout.str()


def test_database_path_that_does_not_exist_says_so_in_one_line(pytester: pytest.Pytester, project: Path) -> None:
    missing = pytester.path / "no_such_db"
    result = run(pytester, missing)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"database directory {missing} does not exist"])
    out = result.stdout.str()
    assert "has no kernel CSVs" not in out and "Traceback" not in out and "plugin.py" not in out
    assert not missing.exists()  # an explicit path is never created


def test_header_only_csvs_are_named(pytester: pytest.Pytester, project: Path) -> None:
    write_csv(project / "Mul.csv", HEADER, [])
    result = run(pytester, project, "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([f"*1 kernel CSV holds a header and no rows (nothing to replay): {project / 'Mul.csv'}"])
    # every file empty: the collection error names them, in one line
    empty = pytester.path / "empty_files_db"
    write_csv(empty / "Mul.csv", HEADER, [])
    write_csv(empty / "Add.csv", HEADER, ["", ""])  # blank lines are no rows either
    result = run(pytester, empty)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([
        f"no kernel rows in {empty}",
        f"  2 kernel CSVs hold a header and no rows (nothing to replay): {empty / 'Add.csv'}, {empty / 'Mul.csv'}",
    ])


def test_unavailable_backend_is_one_line_not_a_traceback(pytester: pytest.Pytester, project: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here")
    result = run(pytester, project, "--backend", "npu")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["kernel replay tests cannot run: --perf-backend npu was asked for, but torch_npu is missing*"])
    assert "Traceback" not in result.stdout.str()


def test_database_whose_files_give_no_rows_says_why(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = pytester.path / "unreadable_db"
    db.mkdir()
    write_csv(db / "Bad Name!.csv", HEADER, ADD_ROWS)
    result = run(pytester, db)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([
        f"no kernel rows in {db}",
        "*kernel type 'Bad Name!' is not a plain name*",
    ])
    # a file that holds no CSV at all stops the run with its own line (tests/test_database_files.py)
    (db / "Add.csv").write_bytes(b"\xff\xfe\x00not a csv\n")
    result = run(pytester, db)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"*{db / 'Add.csv'}: is UTF-16 text, not a UTF-8 CSV*"])


def test_prune_removes_rows_still_without_duration(pytester: pytest.Pytester, project: Path) -> None:
    write_csv(project / "Softmax.csv", HEADER, ['dynamic,AI_CORE,"""8,8""",FLOAT,ND,"""8,8""",FLOAT,ND'])
    result = run(pytester, project, "--prune-empty-duration-rows")
    result.assert_outcomes(passed=3, skipped=1)
    assert read_rows(project / "Softmax.csv") == []
    assert len(read_rows(project / "MatMulV2.csv")) == 2


def test_coverage_gate_fails_the_run_with_a_table(pytester: pytest.Pytester, project: Path) -> None:
    write_csv(project / "Softmax.csv", HEADER, ['dynamic,AI_CORE,"""8,8""",FLOAT,ND,"""8,8""",FLOAT,ND'] * 3)
    result = run(pytester, project, "--replay-coverage-min", "0.9")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*replay coverage: 50.0% of 6 selected rows replayed and passed; no selected row has a profiled time "
            "(Profiling Average Duration(us) x Profiling Count): coverage by time cannot be measured "
            "(below --perf-replay-coverage-min 0.9 by rows)*",
            "*kernel type*rows*replay*passed*",
            "*Softmax*3*0*0*0.0%*",
        ]
    )
    assert run(pytester, project, "--replay-coverage-min", "0.5").ret == 0


def test_coverage_by_time_weighs_rows_by_their_profiled_time(pytester: pytest.Pytester, project: Path) -> None:
    header = HEADER + ",Profiling Average Duration(us),Profiling Count"
    write_csv(project / "MatMulV2.csv", header, [MATMUL_ROWS[0] + ",50,10", MATMUL_ROWS[1] + ",25,4"])  # 600 us
    write_csv(project / "Add.csv", header, [ADD_ROWS[0] + ",2,10"])  # 20 us
    write_csv(project / "Softmax.csv", header, ['dynamic,AI_CORE,"""8,8""",FLOAT,ND,"""8,8""",FLOAT,ND,3,10'] * 2)  # 60 us
    by_rows = run(pytester, project, "--replay-coverage-min", "0.9")
    assert by_rows.ret == pytest.ExitCode.TESTS_FAILED
    by_rows.stdout.fnmatch_lines(["*60.0% of 5 selected rows replayed and passed, 91.2% of their profiled time*"])
    by_time = run(pytester, project, "--replay-coverage-min", "0.9", "--replay-coverage-weight", "time")
    assert by_time.ret == 0, by_time.stdout.str()
    by_time.stdout.fnmatch_lines(["*91.2% of their profiled time (meets --perf-replay-coverage-min 0.9 by time)*"])
    report = json.loads(next((project / "reports").glob("run_report_*.json")).read_text())
    assert report["replay_run"]["coverage_time"] == pytest.approx(620 / 680)


def test_a_failed_coverage_gate_shows_on_the_closing_line(pytester: pytest.Pytester, project: Path) -> None:
    write_csv(project / "Softmax.csv", HEADER, ['dynamic,AI_CORE,"""8,8""",FLOAT,ND,"""8,8""",FLOAT,ND'])
    result = run(pytester, project, "--replay-coverage-min", "0.9")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    last = result.stdout.lines[-1]
    assert "3 passed" in last and "1 skipped" in last and "1 coverage gate failed" in last, last
    passing = run(pytester, project, "--replay-coverage-min", "0.5")
    assert passing.ret == 0 and "coverage gate" not in passing.stdout.lines[-1]


def test_coverage_by_time_without_profiled_time_fails_the_gate_and_says_why(
    pytester: pytest.Pytester, project: Path
) -> None:
    # no Profiling Average Duration(us) x Profiling Count anywhere, as in the shipped sample database
    result = run(pytester, project, "--replay-coverage-min", "0.5", "--replay-coverage-weight", "time")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*replay coverage: 100.0% of 3 selected rows replayed and passed; no selected row has a profiled time "
        "(Profiling Average Duration(us) x Profiling Count): coverage by time cannot be measured "
        "(fails --perf-replay-coverage-min 0.5 by time)*",
    ])
    assert "of their profiled time" not in result.stdout.str()
    report = json.loads(next((project / "reports").glob("run_report_*.json")).read_text())
    assert report["replay_run"]["coverage_time"] is None  # not the row coverage under another name


def test_coverage_gate_with_collect_only(pytester: pytest.Pytester, project: Path) -> None:
    write_csv(project / "Softmax.csv", HEADER, ['dynamic,AI_CORE,"""8,8""",FLOAT,ND,"""8,8""",FLOAT,ND'])
    failing = run(pytester, project, "--collect-only", "-q", "--replay-coverage-min", "0.8")
    assert failing.ret == pytest.ExitCode.TESTS_FAILED
    failing.stdout.fnmatch_lines(["*replay coverage: 75.0% of 4 selected rows have a replay*"])
    assert run(pytester, project, "--collect-only", "-q", "--replay-coverage-min", "0.75").ret == 0


def test_oversized_row_is_skipped_with_file_row_and_column(pytester: pytest.Pytester, project: Path) -> None:
    huge = 'dynamic,AI_CORE,"""4000000,4000000;4000000,16""",FLOAT;FLOAT,ND;ND,"""4000000,16""",FLOAT,ND'
    write_csv(project / "MatMulV2.csv", HEADER, [huge, MATMUL_ROWS[0]])
    result = run(pytester, project, "-k", "MatMulV2", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*MatMulV2.csv, row 2, column 'Input Shapes': tensors need about * GiB*free on cpu*"])
    rows = read_rows(project / "MatMulV2.csv")
    assert len(rows) == 2 and rows[0]["Average Duration(us)"] == "" and rows[1]["Average Duration(us)"]


def test_options_env_and_ini_precedence(pytester: pytest.Pytester, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\nperf_repeat_count = 4\n")
    pytester.runpytest("--database-path", str(project), "-k", "Add", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert read_rows(project / "Add.csv")[0]["MicroBench Samples"] == "4"
    monkeypatch.setenv("PERF_REPEAT_COUNT", "5")
    pytester.runpytest("--database-path", str(project), "-k", "Add", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert read_rows(project / "Add.csv")[0]["MicroBench Samples"] == "5"
    pytester.runpytest("--database-path", str(project), "-k", "Add", "--repeat-count", "6", "-p", "no:cacheprovider")
    assert read_rows(project / "Add.csv")[0]["MicroBench Samples"] == "6"
    bad = pytester.runpytest("--database-path", str(project), "--repeat-count", "0")
    bad.stderr.fnmatch_lines(["*--perf-repeat-count: '0' is not a positive integer*"])
    assert bad.ret == pytest.ExitCode.USAGE_ERROR


def test_new_device_directory_starts_from_the_shipped_sample(pytester: pytest.Pytester, project: Path) -> None:
    root = pytester.path / "root"
    sample = root / "CPU_X86_64" / "torch" / "torch2.13.0"
    write_csv(sample / "MatMulV2.csv", HEADER + ",Average Duration(us)", [MATMUL_ROWS[0] + ",99"])
    result = pytester.runpytest(
        "--database-root", str(root), "--device", "NEW_DEVICE", "--torch-version", "9.9.9",
        "--repeat-count", "2", "-p", "no:cacheprovider",
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*did not exist: started it from the shipped sample*1 rows, identity columns only*"])
    new = root / "NEW_DEVICE" / "torch" / "torch9.9.9" / "MatMulV2.csv"
    rows = read_rows(new)
    assert len(rows) == 1 and rows[0]["Average Duration(us)"] != "99"


KEPT_REPORTS_CONFTEST = """
import json
import pytest

@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    kept = {key: [report.when for report in reports] for key, reports in terminalreporter.stats.items()}
    with open("kept_reports.json", "w") as handle:
        json.dump(kept, handle)
"""


def test_xdist_workers_send_results_to_the_controller(pytester: pytest.Pytester, project: Path) -> None:
    pytester.makeconftest(KEPT_REPORTS_CONFTEST)
    result = pytester.runpytest_subprocess(
        "--database-path", str(project), "--repeat-count", "3", "-n", "2", "-p", "no:cacheprovider",
        "--profile-batch-size", "1",
    )
    result.assert_outcomes(passed=3)
    for name in ("MatMulV2.csv", "Add.csv"):
        assert all(float(r["Average Duration(us)"]) > 0 for r in read_rows(project / name))
    # the workers' reports reach the controller's terminal reporter: only the counted ones stay
    kept = json.loads((pytester.path / "kept_reports.json").read_text())
    assert kept.get("", []) == [] and kept["passed"] == ["call"] * 3


@pytest.mark.parametrize("workers", [None, "2"])
def test_results_in_transit_are_not_reported_as_another_tests_properties(
    pytester: pytest.Pytester, project: Path, workers: str | None
) -> None:
    import xml.etree.ElementTree as ElementTree

    # batches of 2: a batch's results ride on the report of whichever test came next
    args = ["--database-path", str(project), "--repeat-count", "3", "-p", "no:cacheprovider",
            "--profile-batch-size", "2", "--junitxml", "junit.xml"]
    if workers:
        result = pytester.runpytest_subprocess(*args, "-n", workers)
    else:
        result = pytester.runpytest(*args)
    result.assert_outcomes(passed=3)
    for name in ("MatMulV2.csv", "Add.csv"):
        assert all(float(r["Average Duration(us)"]) > 0 for r in read_rows(project / name))
    testcases = ElementTree.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    properties = [[p.get("name") for p in case.iter("property")] for case in testcases]
    assert properties == [["perf_case"]] * 3  # each test's own case, nothing in transit


def test_concurrent_session_holding_the_lock_fails_write_back_cleanly(
    pytester: pytest.Pytester, project: Path
) -> None:
    import filelock

    before = (project / "MatMulV2.csv").read_bytes()
    with filelock.FileLock(str(project / ".perfdb.lock")):
        result = run(pytester, project, "--lock-timeout", "0.2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*write-back failed, database left as it was*another session*"])
    assert (project / "MatMulV2.csv").read_bytes() == before


def test_heap_is_frozen_during_the_replays_and_thawed_after(pytester: pytest.Pytester, project: Path) -> None:
    import gc

    pytester.makeconftest(
        "import gc\n"
        "def pytest_runtest_call(item):\n"
        "    item.config._frozen_seen = getattr(item.config, '_frozen_seen', []) + [gc.get_freeze_count()]\n"
        "def pytest_unconfigure(config):\n"
        "    open('frozen.txt', 'w').write(','.join(map(str, getattr(config, '_frozen_seen', []))))\n"
    )
    before = gc.get_freeze_count()
    run(pytester, project).assert_outcomes(passed=3)
    seen = [int(n) for n in (pytester.path / "frozen.txt").read_text().split(",")]
    assert len(seen) == 3 and all(n > before for n in seen)  # long-lived objects exempt from collection
    assert gc.get_freeze_count() == before == 0  # thawed when the run ends


def test_rows_sharing_a_signature_each_get_their_own_cases_duration(pytester: pytest.Pytester, project: Path) -> None:
    # the same M, K, N with the weight transposed or not: one signature, two rows, two cases
    transposed = 'dynamic,AI_CORE,"""32,64;16,64""",FLOAT;FLOAT,ND;ND,"""32,16""",FLOAT,ND'
    write_csv(project / "MatMulV2.csv", HEADER, [MATMUL_ROWS[0], transposed])
    run(pytester, project, "-k", "MatMulV2").assert_outcomes(passed=2)
    (report,) = (project / "reports").glob("run_report_*.json")
    means = {r["row_line"]: r["stats"]["mean_us"] for r in json.loads(report.read_text())["results"]}
    written = {i + 2: float(r["Average Duration(us)"]) for i, r in enumerate(read_rows(project / "MatMulV2.csv"))}
    assert written == pytest.approx({line: means[line] for line in written}, abs=1e-3)
