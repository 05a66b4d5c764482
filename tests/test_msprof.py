"""The msprof collector: op_summary matching, the msprof command, the launch, the plugin wiring.

No genuine msprof ``op_summary_*.csv`` is public, so the tests build one from the real
``kernel_details`` fixture by renaming its columns back to msprof's names (SOURCES.md gives the
mapping) and place it where msprof puts it: ``PROF_*/mindstudio_profiler_output/``.  Expected
values are computed here from the fixture with the csv module.
"""

from __future__ import annotations

import csv
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from perf_plugin.backends.cpu import CpuBackend
from perf_plugin.database.schema import format_number
from perf_plugin.database.signature import signature_text
from perf_plugin.profiling import msprof
from perf_plugin.profiling.msprof import (
    CHILD_ENV,
    RECORD_ENV,
    MsprofCollector,
    MsprofError,
    external_mode,
    read_measured,
)
from perf_plugin.profiling.msprof_match import (
    match_profile,
    msprof_results,
)
from perf_plugin.replay.registry import get_replay, signature_of
from perf_plugin.run.cases import load_case_set
from perf_plugin.run.msprof_launch import (
    MSPROF_OPTIONS,
    external_run,
    find_prof_dirs,
    msprof_command,
    run_under_msprof,
)
from perf_plugin.run.writeback import WritebackRequest, write_back
from tests.conftest import OP_SUMMARY_COLUMNS

FIXTURE = Path(__file__).parent / "fixtures" / "ascend" / "kernel_details_level2_llm_train.csv"
BENCH_TEST = (Path(__file__).parents[1] / "bench" / "test_kernels.py").read_text()
RENAMES = OP_SUMMARY_COLUMNS
IDENTITY = [
    "OP State", "Accelerator Core", "Input Shapes", "Input Data Types", "Input Formats",
    "Output Shapes", "Output Data Types", "Output Formats",
]
V3 = ("MatMulV3", '"4096,1024;4096,1024"', '"4096,4096"')  # 28 launches in the fixture
V2 = ("MatMulV2", '"4096,4096;4096,1024"', '"4096,1024"')  # 56 launches


# ----------------------------------------------------------------------------- fixtures
def fixture_rows() -> list[dict[str, str]]:
    with FIXTURE.open(encoding="utf-8-sig", newline="") as handle:
        return list(csv.DictReader(handle))


def counter_names() -> list[str]:
    with FIXTURE.open(encoding="utf-8-sig", newline="") as handle:
        header = next(csv.reader(handle))
    return header[header.index("Context ID") + 1 :]


def launches(kernel_type: str, inputs: str, outputs: str) -> list[dict[str, str]]:
    """The fixture's launches of one kernel, in start-time order."""
    rows = [
        r for r in fixture_rows()
        if r["Type"] == kernel_type and r["Input Shapes"] == inputs and r["Output Shapes"] == outputs
    ]
    return sorted(rows, key=lambda r: float(r["Start Time(us)"]))


def signatures(rows: list[dict[str, str]]) -> set[tuple[str, str]]:
    """Distinct (kernel type, database signature) of fixture rows.  The signature is the database
    contract (scalar slots carry no dtype, so ``Add`` of two scalars is one kernel whatever the dtype)."""
    return {(r["Type"], signature_text(signature_of(r["Type"], r))) for r in rows}


def durations(rows: list[dict[str, str]]) -> tuple[float, ...]:
    return tuple(float(r["Duration(us)"]) for r in rows)


def counter_mean(rows: list[dict[str, str]], counter: str) -> float:
    values = [float(r[counter]) for r in rows if r[counter].strip() not in ("", "N/A")]
    return sum(values) / len(values)


def op_summary_text(lines: list[str] | None = None) -> str:
    """The fixture as msprof writes op_summary: kernel_details names renamed back, rows unchanged."""
    raw = FIXTURE.read_text(encoding="utf-8-sig").splitlines(keepends=True)
    header = ",".join(RENAMES.get(name, name) for name in raw[0].rstrip("\r\n").split(","))
    return header + raw[0][len(raw[0].rstrip("\r\n")) :] + "".join(raw[1:] if lines is None else lines)


def write_prof(root: Path, text: str | None = None, name: str = "PROF_000001_20251127120000000_ABCDEFGHIJKLMNOP") -> Path:
    prof = root / name
    out = prof / "mindstudio_profiler_output"
    out.mkdir(parents=True)
    (prof / "device_0").mkdir()
    (out / "op_summary_20251127120000.csv").write_text(text if text is not None else op_summary_text())
    return prof


@pytest.fixture(scope="module")
def prof(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_prof(tmp_path_factory.mktemp("msprof"))


def db_row(kernel_type: str, inputs: str, outputs: str) -> dict[str, str]:
    first = launches(kernel_type, inputs, outputs)[0]
    return {c: first[c] for c in IDENTITY}


def write_db(path: Path, rows: list[dict[str, str]], extra: dict[str, str] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = IDENTITY + list(extra or {})
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        for row in rows:
            writer.writerow([row[c] for c in IDENTITY] + list((extra or {}).values()))
    return path


def cases_of(db: Path) -> list:
    return [c for c in load_case_set(db, get_replay).cases if c.runnable]


def read_db(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


# ----------------------------------------------------------------------------- matching
@pytest.mark.parametrize(("warmup", "repeats"), [(2, 25), (7, 20), (0, 27)])
def test_samples_are_the_launches_after_verification_and_warmup(
    tmp_path: Path, prof: Path, warmup: int, repeats: int
) -> None:
    db = write_db(tmp_path / "db" / "MatMulV3.csv", [db_row(*V3)])
    (case,) = cases_of(db.parent)
    rows = launches(*V3)
    assert len(rows) == 1 + warmup + repeats  # one case's block: verification + warm-up + repeats

    (result,) = [r for r in msprof_results(prof, [case], repeats, warmup) if r.ref.case_id == case.ref.case_id]

    kept = rows[1 + warmup :]
    assert result.outcome == "passed"
    assert result.samples_us == durations(kept)
    assert result.reported_kernel_type is None
    assert result.counters == {c: counter_mean(kept, c) for c in counter_names()}
    assert result.identity == {c: kept[-1][c] for c in IDENTITY}
    assert result.kernels[0].name == kept[0]["Name"]


def test_cases_sharing_a_signature_get_one_block_each(tmp_path: Path, prof: Path) -> None:
    db = write_db(tmp_path / "db" / "MatMulV3.csv", [db_row(*V3), db_row(*V3)])
    first, second = cases_of(db.parent)
    assert second.ref.case_id == first.ref.case_id + "#2"
    rows = launches(*V3)  # 28 = 2 cases x (1 + 3 warm-up + 10 repeats)

    results = {r.ref.case_id: r for r in msprof_results(prof, [first, second], 10, 3)}

    assert results[first.ref.case_id].samples_us == durations(rows[4:14])
    assert results[second.ref.case_id].samples_us == durations(rows[18:28])


def test_matmul_family_measurement_goes_to_the_reported_kernel_type(tmp_path: Path, prof: Path) -> None:
    # A MatMulV2 row recorded with B as (K, N): its canonical signature is the MatMulV3 kernel's.
    v2_row = dict(db_row(*V3), **{"Input Shapes": '"4096,1024;1024,4096"'})
    db = tmp_path / "db"
    write_db(db / "MatMulV2.csv", [v2_row])
    extra = {"Profiling Average Duration(us)": "900", "Profiling Average aicore_time(us)": "880"}
    write_db(db / "MatMulV3.csv", [db_row(*V3)], extra)
    v2_case = next(c for c in cases_of(db) if c.ref.kernel_type == "MatMulV2")
    before_v2 = (db / "MatMulV2.csv").read_bytes()

    (result,) = [r for r in msprof_results(prof, [v2_case], 25, 2) if r.ref.case_id == v2_case.ref.case_id]
    assert result.ref.kernel_type == "MatMulV2" and result.ref.csv_file == "MatMulV2.csv"
    assert result.reported_kernel_type == "MatMulV3"

    write_back(WritebackRequest(db, "all", False, "20251127_120000"), [result], [])
    (row,) = read_db(db / "MatMulV3.csv")
    kept = launches(*V3)[3:]
    assert row["Average Duration(us)"] == format_number(sum(durations(kept)) / 25)
    assert row["MicroBench Samples"] == "25"
    assert row["MicroBench aicore_time(us)"] == format_number(counter_mean(kept, "aicore_time(us)"))
    header = list(row)
    assert header.index("Average Duration(us)") < header.index("Profiling Average Duration(us)")
    assert header.index("MicroBench aicore_time(us)") == header.index("Profiling Average aicore_time(us)") - 1
    assert (db / "MatMulV2.csv").read_bytes() == before_v2  # the case's own CSV is not where it goes


def test_extra_launches_are_cut_from_the_head_with_a_note(tmp_path: Path, prof: Path) -> None:
    db = write_db(tmp_path / "db" / "MatMulV2.csv", [db_row(*V2)])
    (case,) = cases_of(db.parent)
    rows = launches(*V2)  # 56 launches, one case of 1 + 2 + 25: the latest block is the case's

    match = match_profile(prof, [case], 25, 2)

    (result,) = [r for r in match.results if r.ref.case_id == case.ref.case_id]
    assert result.samples_us == durations(rows[-25:])
    assert any("56 launches where 1 case(s) make 28" in note for note in match.notes)


def test_fewer_launches_than_a_block_still_drop_verification_and_warmup(tmp_path: Path, prof: Path) -> None:
    db = write_db(tmp_path / "db" / "MatMulV3.csv", [db_row(*V3)])
    (case,) = cases_of(db.parent)
    rows = launches(*V3)  # 28 launches; the settings say 1 + 5 + 30 = 36 (e.g. an interrupted run)

    match = match_profile(prof, [case], 30, 5)

    (result,) = [r for r in match.results if r.ref.case_id == case.ref.case_id]
    assert result.samples_us == durations(rows[6:])
    assert any("28 launches where 1 case(s) make 36" in note for note in match.notes)


def test_launches_on_different_devices_are_cut_separately(tmp_path: Path) -> None:
    # The same kernel on device 1, interleaved in time with device 0's launches.
    raw = FIXTURE.read_text(encoding="utf-8-sig").splitlines(keepends=True)
    header = raw[0].rstrip("\r\n").split(",")
    device, start = header.index("Device_id"), header.index("Start Time(us)")
    mine = [line for line in raw[1:] if ",MatMulV3,dynamic," in line and '"""4096,1024;4096,1024"""' in line]
    shifted = []
    for line in mine:
        cells = line.split(",")  # these rows' shape cells hold commas: only the leading cells change
        cells[device] = "1"
        cells[start] = f"{float(cells[start]) + 0.5:.3f}\t"
        shifted.append(",".join(cells))
    prof = write_prof(tmp_path, op_summary_text(mine + shifted))
    db = write_db(tmp_path / "db" / "MatMulV3.csv", [db_row(*V3), db_row(*V3)])
    first, second = cases_of(db.parent)

    results = {r.ref.case_id: r for r in msprof_results(prof, [first, second], 25, 2)}

    steady = durations(launches(*V3)[3:])
    assert results[first.ref.case_id].samples_us == steady
    assert results[second.ref.case_id].samples_us == steady


def test_rows_no_case_produced_come_back_with_identity(tmp_path: Path, prof: Path) -> None:
    db = write_db(tmp_path / "db" / "MatMulV3.csv", [db_row(*V3)])
    (case,) = cases_of(db.parent)

    results = msprof_results(prof, [case], 25, 2)

    unmatched = {r.ref.case_id: r for r in results if r.ref.case_id != case.ref.case_id}
    rms = launches("RmsNorm", '"4096,1,1024;1024"', '"4096,1,1024;4096,1,1"')
    (result,) = [r for r in unmatched.values() if r.ref.kernel_type == "RmsNorm" and r.identity["Input Shapes"] == rms[0]["Input Shapes"]]
    assert result.samples_us == durations(rms)  # nothing says which were warm-up: all launches
    assert result.identity == {c: rms[-1][c] for c in IDENTITY}
    assert result.ref.csv_file == "RmsNorm.csv" and result.ref.row_line is None
    assert not any(r.ref.kernel_type.startswith("hcom_") for r in results)
    expected_kernels = signatures(
        [r for r in fixture_rows() if not r["Type"].startswith("hcom_") and r["Accelerator Core"] not in ("COMMUNICATION", "HCCL")]
    )
    assert len(unmatched) == len(expected_kernels) - 1

    limited = msprof_results(prof, [case], 25, 2, unmatched_kernel_types={"MatMulV3"})
    assert {r.ref.kernel_type for r in limited} == {"MatMulV3", "MatMulV2"}  # the family, nothing else


def test_case_without_launches_fails_with_the_reason(tmp_path: Path, prof: Path) -> None:
    row = dict(db_row(*V3), **{"Input Shapes": '"4096,1024;8192,1024"', "Output Shapes": '"4096,8192"'})
    db = write_db(tmp_path / "db" / "MatMulV3.csv", [row])
    (case,) = cases_of(db.parent)

    (result,) = [r for r in msprof_results(prof, [case], 25, 2) if r.ref.case_id == case.ref.case_id]

    assert result.outcome == "failed" and not result.samples_us
    assert "msprof recorded no MatMulCommon|MatMulV2|MatMulV3 kernel with this signature" in result.reason


def test_profile_without_op_summary_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "PROF_1" / "device_0").mkdir(parents=True)
    with pytest.raises(MsprofError, match="no op_summary_.*msprof --export=on"):
        msprof_results(tmp_path / "PROF_1", [], 25, 2)


# ----------------------------------------------------------------------------- collector
def test_collector_runs_each_repeat_once_and_records_it(tmp_path: Path, prof: Path) -> None:
    db = write_db(tmp_path / "db" / "MatMulV3.csv", [db_row(*V3)])
    (case,) = cases_of(db.parent)
    record = tmp_path / "record"
    collector = MsprofCollector(CpuBackend(), record_dir=record)
    calls: list[str] = []

    collector.measure(case.ref, lambda: calls.append("run"), 25, lambda: calls.append("flush"))

    assert calls == ["flush", "run"] * 25
    assert collector.kind == "external"
    assert collector.drain() == [] and collector.finish() == []
    (logged,) = read_measured(record)
    assert (logged.ref.case_id, logged.ref.signature_key, logged.repeats) == (case.ref.case_id, case.ref.signature_key, 25)
    (result,) = [r for r in msprof_results(prof, [logged], 25, 2) if r.ref.case_id == case.ref.case_id]
    assert result.samples_us == durations(launches(*V3)[3:])


def test_collector_records_the_repeats_that_ran_before_a_failure(tmp_path: Path) -> None:
    db = write_db(tmp_path / "db" / "MatMulV3.csv", [db_row(*V3)])
    (case,) = cases_of(db.parent)
    collector = MsprofCollector(CpuBackend(), record_dir=tmp_path)
    calls = iter(range(10))

    def run_once() -> None:
        if next(calls) == 2:
            raise RuntimeError("device error")

    with pytest.raises(RuntimeError):
        collector.measure(case.ref, run_once, 25)
    assert [m.repeats for m in read_measured(tmp_path)] == [2]


# ----------------------------------------------------------------------------- the launch
def test_msprof_command_puts_the_application_last() -> None:
    command = msprof_command("/opt/msprof", "/data/out", ["bench", "-k", "MatMulV3 and not big", "-n", "8"], "/usr/bin/python3")
    assert command == [
        "/opt/msprof", "--output=/data/out", "--task-time=on", "--ai-core=on", "--aic-mode=task-based",
        "--aic-metrics=PipeUtilization", "/usr/bin/python3", "-m", "pytest", "bench", "-k", "MatMulV3 and not big", "-n", "8",
    ]
    assert command[2:6] == list(MSPROF_OPTIONS)
    with pytest.raises(MsprofError, match="characters msprof refuses"):
        msprof_command("msprof", "/data/out;rm", [], "python")


def test_external_mode() -> None:
    assert external_mode(None, "npu", {}) == "launch"
    assert external_mode(Path("PROF_1"), "npu", {}) == "read"
    assert external_mode(Path("PROF_1"), "cpu", {}) == "read"
    assert external_mode(None, "cuda", {}) is None
    assert external_mode(None, "npu", {CHILD_ENV: "1"}) is None  # never msprof inside msprof


def test_find_prof_dirs_newest_last_and_not_nested(tmp_path: Path) -> None:
    old = tmp_path / "PROF_000001_a"
    new = tmp_path / "sub" / "PROF_000002_b"
    (old / "PROF_inner").mkdir(parents=True)
    new.mkdir(parents=True)
    os.utime(old, (1_000_000, 1_000_000))
    assert find_prof_dirs(tmp_path) == [old, new]


def test_missing_msprof_is_one_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    output = tmp_path / "out"
    with pytest.raises(MsprofError) as info:
        run_under_msprof(["bench"], cwd=tmp_path, output_root=output, environ={"PATH": str(tmp_path)})
    assert str(info.value).startswith("msprof was not found on PATH")
    assert "\n" not in str(info.value)
    assert not output.exists()


STANDIN_MSPROF = """\
#!{python}
# Stands in for msprof: checks the options, runs the application with this environment, then
# writes a PROF_ directory with an op_summary as msprof exports it.
import os, pathlib, shutil, subprocess, sys

args = sys.argv[1:]
options = []
while args and args[0].startswith("--"):
    options.append(args.pop(0))
missing = {{"--task-time=on", "--ai-core=on", "--aic-metrics=PipeUtilization"}} - set(options)
output = [o.split("=", 1)[1] for o in options if o.startswith("--output=")]
if missing or not output or not args:
    sys.exit(f"stand-in msprof: bad command line {{sys.argv}}")
code = subprocess.call(args)
prof = pathlib.Path(output[0]) / "PROF_000001_20251127120000000_STANDIN"
(prof / "device_0").mkdir(parents=True)
(prof / "mindstudio_profiler_output").mkdir()
shutil.copy(os.environ["STANDIN_OP_SUMMARY"], prof / "mindstudio_profiler_output" / "op_summary_20251127120000.csv")
sys.exit(code)
"""

MUL = ("Mul", '"1024;"', '"1024"')  # 14 launches: one case of 1 + 3 warm-up + 10 repeats
CAST = ("Cast", '"1024"', '"1024"')  # 70 launches (the model cast these weights often)


def test_session_runs_under_msprof_and_its_profile_is_written_back(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    standin = bin_dir / "msprof"
    standin.write_text(STANDIN_MSPROF.format(python=sys.executable))
    standin.chmod(standin.stat().st_mode | stat.S_IXUSR)
    summary = tmp_path / "op_summary.csv"
    summary.write_text(op_summary_text())
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_kernels.py").write_text(BENCH_TEST)
    db = project / "db"
    write_db(db / "Mul.csv", [db_row(*MUL)])
    write_db(db / "Cast.csv", [dict(db_row(*CAST), **{"Output Data Types": "DT_BF16"})])
    before = {p.name: p.read_bytes() for p in db.iterdir()}
    cases = [(c.ref.case_id, c) for c in cases_of(db)]
    environ = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", STANDIN_OP_SUMMARY=str(summary))
    argv = ["--database-path", str(db), "--repeat-count", "10", "--warmup-count", "3", "-p", "no:cacheprovider", "-q", "test_kernels.py"]

    outcome = external_run(
        "launch", cases, repeat_count=10, warmup_count=3, argv=argv, cwd=project,
        output_root=tmp_path / "msprof_output", environ=environ,
    )

    # the session under msprof replayed both rows and wrote nothing into the database
    assert {p.name: p.read_bytes() for p in db.iterdir()} == before
    assert sorted(r.outcome for r in outcome.records.values()) == ["passed", "passed"]
    assert outcome.failed == 0
    (session_json,) = (tmp_path / "msprof_output").glob("run_*/perf_session/session.json")
    assert len(json.loads(session_json.read_text())["records"]) == 2

    files, _ = write_back(WritebackRequest(db, "all", False, "20251127_120000"), outcome.results, [])
    mul = read_db(db / "Mul.csv")
    kept = launches(*MUL)[4:]
    assert mul[0]["Average Duration(us)"] == format_number(sum(durations(kept)) / 10)
    assert mul[0]["MicroBench aiv_time(us)"] == format_number(counter_mean(kept, "aiv_time(us)"))
    cast = read_db(db / "Cast.csv")
    assert cast[0]["Average Duration(us)"] == format_number(sum(durations(launches(*CAST)[-10:])) / 10)
    # update mode all: Cast and Mul kernels of other signatures are appended, nothing else
    for kernel_type, rows in (("Cast", cast), ("Mul", mul)):
        assert len(rows) == len(signatures([r for r in fixture_rows() if r["Type"] == kernel_type]))
        assert all(r["Row Origin"] == "measured:npu" for r in rows[1:])
    assert sorted(f.csv_file for f in files) == ["Cast.csv", "Mul.csv"]


def test_session_that_records_nothing_is_an_error(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    standin = bin_dir / "msprof"
    standin.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(3)\n")
    standin.chmod(standin.stat().st_mode | stat.S_IXUSR)
    environ = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(MsprofError, match=r"ended \(exit code 3\) before recording its results; nothing was written"):
        external_run("launch", [], repeat_count=10, warmup_count=3, cwd=tmp_path, output_root=tmp_path / "o", environ=environ)


# ----------------------------------------------------------------------------- the plugin
@pytest.fixture(scope="module", autouse=True)
def _profiler_modules_loaded() -> None:
    """As in test_plugin: load what a profiler session imports lazily before pytester's runs.

    The replay modules too, so that pytester's runs do not import them again each time.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    from perf_plugin.replay.registry import refresh_catalog

    refresh_catalog()
    with profile(activities=[ProfilerActivity.CPU]):
        torch.ones(1).add(1)


V3B = ("MatMulV3", '"4096,2048;1024,2048"', '"4096,1024"')  # 28 launches


@pytest.fixture
def project(pytester: pytest.Pytester) -> Path:
    """A MatMulV3 row, and a MatMulV2 row whose kernel the profile reports as MatMulV3 (V3 above)."""
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = pytester.path / "db"
    write_db(db / "MatMulV3.csv", [db_row(*V3B)])
    write_db(db / "MatMulV2.csv", [dict(db_row(*V3), **{"Input Shapes": '"4096,1024;1024,4096"'})])
    return db


def mean(values: tuple[float, ...]) -> float:
    return sum(values) / len(values)


def test_prof_path_is_read_instead_of_replaying(pytester: pytest.Pytester, project: Path, prof: Path) -> None:
    v2_before = read_db(project / "MatMulV2.csv")
    result = pytester.runpytest(
        "--database-path", str(project), "--prof-path", str(prof), "--repeat-count", "25",
        "--warmup-count", "2", "-p", "no:cacheprovider", "-n", "2",
    )

    assert result.ret == 0
    result.stdout.fnmatch_lines(["*msprof: read *(no replay ran; each case taken as 25 repeats)*"])
    result.stdout.no_fnmatch_line("*created: 2/2 workers*")  # no local workers: nothing runs here
    v3 = read_db(project / "MatMulV3.csv")
    assert v3[0]["Average Duration(us)"] == format_number(mean(durations(launches(*V3B)[3:])))
    assert v3[0]["MicroBench Backend"] == "npu"
    # the MatMulV2 row's kernel went to MatMulV3.csv, where update mode all appended it
    (moved,) = [r for r in v3[1:] if r["Input Shapes"] == V3[1]]
    assert moved["Average Duration(us)"] == format_number(mean(durations(launches(*V3)[3:])))
    v2 = read_db(project / "MatMulV2.csv")
    assert v2[0] == {**v2_before[0], **{k: v for k, v in v2[0].items() if k not in v2_before[0]}}
    assert v2[0]["Average Duration(us)"] == ""
    # unmatched kernels of the selected families are appended where the profiler filed them
    assert len(v3) == len(signatures([r for r in fixture_rows() if r["Type"] == "MatMulV3"]))
    assert len(v2) == 1 + len(signatures([r for r in fixture_rows() if r["Type"] == "MatMulV2"]))
    assert len(list((project / "reports").glob("replay_report_*.md"))) == 1


def test_prof_path_missing_only_reports_unmatched_without_appending(
    pytester: pytest.Pytester, project: Path, prof: Path
) -> None:
    result = pytester.runpytest(
        "--database-path", str(project), "--prof-path", str(prof), "--repeat-count", "25",
        "--warmup-count", "2", "--update-mode", "missing-only", "-p", "no:cacheprovider",
    )

    assert result.ret == 0
    result.stdout.fnmatch_lines(["*write-back (missing-only): * 1 rows updated, 0 appended*"])
    (row,) = read_db(project / "MatMulV3.csv")
    assert row["Average Duration(us)"] == format_number(mean(durations(launches(*V3B)[3:])))
    (v2,) = read_db(project / "MatMulV2.csv")
    assert v2.get("Average Duration(us)", "") == ""
    (report,) = (project / "reports").glob("run_report_*.json")
    unmatched = {f["csv_file"]: f["unmatched_samples"] for f in json.loads(report.read_text())["writeback"]}
    assert "MatMulV2-4096x1024,1024x4096-BF16-to-4096x4096-BF16" in unmatched["MatMulV3.csv"]


def test_missing_prof_path_fails_and_writes_nothing(pytester: pytest.Pytester, project: Path) -> None:
    before = {p.name: p.read_bytes() for p in project.iterdir()}
    result = pytester.runpytest(
        "--database-path", str(project), "--prof-path", str(pytester.path / "PROF_missing"), "-p", "no:cacheprovider"
    )

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: *PROF_missing: profiling path does not exist; nothing was written"])
    assert {p.name: p.read_bytes() for p in project.iterdir()} == before


def test_session_under_msprof_records_outcomes_and_leaves_the_database(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = pytester.path / "db"
    write_db(db / "Mul.csv", [db_row(*MUL)])
    before = (db / "Mul.csv").read_bytes()
    record = pytester.path / "record"
    monkeypatch.setenv(CHILD_ENV, "1")
    monkeypatch.setenv(RECORD_ENV, str(record))

    result = pytester.runpytest("--database-path", str(db), "--repeat-count", "3", "--warmup-count", "1", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1)
    assert (db / "Mul.csv").read_bytes() == before
    assert not (db / "reports").exists()
    report = json.loads((record / msprof.SESSION_REPORT).read_text())
    (entry,) = report["records"].values()
    assert (entry["ref"]["kernel_type"], entry["outcome"]) == ("Mul", "passed")
    assert report["results"] == []  # CPU timings of the child are not the measurement
