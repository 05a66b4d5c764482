"""A case that kills its worker (abort, segfault) under ``-n 2``: recorded as failed with its cause,
the worker replaced, every other row measured and written, those a crashed worker took with it
measured again; and ``--perf-case-ids-file`` replays only the cases it lists."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from perf_plugin.results import CaseRef
from perf_plugin.run.crashes import crash_cause, lost_case_ids, read_case_ids, rerun_lost_cases
from perf_plugin.run.state import CaseRecord
from tests.test_plugin import BENCH_TEST, HEADER, _profiler_modules_loaded  # noqa: F401  (torch.profiler's lazy imports, before pytester)


# A test-only replay that takes its process down for chosen rows: 13 rows abort, 17 rows segfault.
CRASH_REPLAY = '''
import ctypes
import os

from perf_plugin.replay.base import CaseBuildError, OpReplay


class CrashReplay(OpReplay):
    kernel_types = ("Crash",)
    npu_api = "torch.tanh"

    def check(self, row):
        if len(row.present_inputs) != 1 or len(row.present_outputs) != 1:
            raise CaseBuildError("Crash needs one input and one output")

    def make_inputs(self, row, device, generator):
        return (self.random(row.present_inputs[0], device, generator),)

    def run(self, x):
        if x.shape[0] == 13:
            os.abort()
        if x.shape[0] == 17:
            ctypes.string_at(0)
        return x.tanh()
'''
CONFTEST = '''
def pytest_perf_replay_modules(config):
    return ["crash_replays"]
'''
ROWS = (4, 13, 5, 17, 6, 7, 8, 9)


def _project(pytester: pytest.Pytester) -> Path:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(crash_replays=CRASH_REPLAY, test_kernels=BENCH_TEST)
    db = pytester.path / "db"
    db.mkdir()
    lines = [HEADER] + [f'dynamic,CPU,"""{n},8""",FLOAT,ND,"""{n},8""",FLOAT,ND' for n in ROWS]
    (db / "Crash.csv").write_text("\n".join(lines) + "\n")
    return db


def _durations(db: Path) -> dict[str, str]:
    with (db / "Crash.csv").open(newline="") as handle:
        return {row["Input Shapes"].strip('"').split(",")[0]: row["Average Duration(us)"] for row in csv.DictReader(handle)}


def test_cases_that_kill_their_worker_fail_with_the_cause_and_every_other_row_is_written(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _project(pytester)
    temp = pytester.path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # where the run keeps its workers' fault logs
    result = pytester.runpytest_subprocess(
        "--perf-database-path", str(db), "-n", "2", "-p", "no:cacheprovider", "--perf-repeat-count", "3",
        "--perf-warmup-count", "1", timeout=240,
    )
    result.assert_outcomes(passed=len(ROWS) - 2, failed=2)
    result.stdout.fnmatch_lines_random([
        "*crashed while running*Crash-13x8*: Fatal Python error: Aborted*crash_replays.py*in run*",
        "*crashed while running*Crash-17x8*: Fatal Python error: Segmentation fault*crash_replays.py*in run*",
    ])
    durations = _durations(db)
    assert durations["13"] == "" and durations["17"] == ""  # nothing measured: the row is left as it was
    assert all(float(durations[str(n)]) > 0 for n in ROWS if n not in (13, 17))  # every other row written
    # the run's report, then the re-run's where a crashed worker had measured cases not yet sent
    first, *rerun = sorted((db / "reports").glob("run_report_*.json"))
    results = {r["row_line"]: r for r in json.loads(first.read_text())["results"]}
    assert results[3]["outcome"] == "failed" and "took its worker down: Fatal Python error: Aborted" in results[3]["reason"]
    assert all(r["outcome"] == "passed" for report in rerun for r in json.loads(report.read_text())["results"])
    assert not list(temp.glob("perf-worker-faults-*"))  # the fault logs went with the run


def test_case_ids_file_replays_only_the_cases_it_lists(pytester: pytest.Pytester) -> None:
    db = _project(pytester)
    ids = pytester.path / "ids.txt"
    ids.write_text("# the two to measure\nCrash-4x8-FLOAT-to-4x8-FLOAT\n\nCrash-6x8-FLOAT-to-6x8-FLOAT\n")
    result = pytester.runpytest_subprocess(
        "--perf-database-path", str(db), "--perf-case-ids-file", str(ids), "-p", "no:cacheprovider",
        "--perf-repeat-count", "3", "--perf-warmup-count", "1", timeout=120,
    )
    result.assert_outcomes(passed=2, deselected=len(ROWS) - 2)
    durations = _durations(db)
    assert {n for n, value in durations.items() if value} == {"4", "6"}


def test_the_cause_is_the_fault_handlers_first_line_and_innermost_frames(tmp_path: Path) -> None:
    log = tmp_path / "gw0.fault.txt"
    log.write_text(
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n"
        '  File "/x/ctypes/__init__.py", line 519 in string_at\n  File "/p/replays.py", line 9 in run\n'
    )
    assert crash_cause(log) == (
        'Fatal Python error: Segmentation fault; File "/x/ctypes/__init__.py", line 519 in string_at; '
        'File "/p/replays.py", line 9 in run'
    )
    assert "killed by a signal" in crash_cause(tmp_path / "missing.txt")


def test_lost_cases_are_the_passed_ones_without_a_result(tmp_path: Path) -> None:
    def record(case_id: str, outcome: str) -> CaseRecord:
        return CaseRecord(CaseRef(case_id, "Crash", "Crash.csv", 2, ""), "ready", "", outcome)

    records = [record("a", "passed"), record("b", "passed"), record("c", "failed"), record("d", "skipped")]
    assert lost_case_ids(records, {"a": object()}) == ["b"]
    ids = tmp_path / "ids"
    ids.write_text("a\n  # comment\n\nb \n")
    assert read_case_ids(ids) == {"a", "b"}
    with pytest.raises(ValueError, match="cannot read the case ids file"):
        read_case_ids(tmp_path / "none")


def test_isolate_without_xdist_runs_the_cases_in_a_worker_that_a_crash_costs_only_its_case(
    pytester: pytest.Pytester,
) -> None:
    db = _project(pytester)
    result = pytester.runpytest_subprocess(
        "--perf-database-path", str(db), "--perf-isolate", "-p", "no:cacheprovider", "--perf-repeat-count", "3",
        "--perf-warmup-count", "1", timeout=240,
    )
    result.assert_outcomes(passed=len(ROWS) - 2, failed=2)
    result.stdout.fnmatch_lines(["*crashed while running*Fatal Python error*"])
    durations = _durations(db)
    assert all(float(durations[str(n)]) > 0 for n in ROWS if n not in (13, 17))


def test_the_rerun_names_its_ids_file_in_one_argument(tmp_path: Path) -> None:
    # pytest picks its rootdir before it knows the option: a separate path argument would count
    # as a test path there, and the re-run's node ids could differ from the run's
    recorder = tmp_path / "python"
    recorder.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/argv.txt"\n')
    recorder.chmod(0o755)
    ids = tmp_path / "journal" / "lost.txt"
    assert rerun_lost_cases(["a", "b"], ["bench", "-q"], tmp_path, ids, python=str(recorder)) == 0
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv == ["-m", "pytest", "bench", "-q", f"--perf-case-ids-file={ids}"]
    assert read_case_ids(ids) == {"a", "b"}
