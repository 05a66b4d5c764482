"""When the session under msprof ends before recording its results (a kernel that brings its
process down), each kernel type runs in a session of its own, so one bad kernel type costs only
its own rows.

The stand-in msprof runs the real pytest session, then exports a ``PROF_*`` directory in
msprof's layout whose ``op_summary`` holds the fixture's rows of the kernel types whose cases that
session recorded as passed (what msprof would have recorded it launching); a session that ended
before recording gets an op_summary with no rows.  A project conftest aborts
the process when a case of a kernel type named in ``ABORT_KERNEL_TYPES`` runs, as an AI Core
exception or a segmentation fault would.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from perf_plugin.database.schema import format_number
from perf_plugin.profiling.msprof import MsprofError
from perf_plugin.run.msprof_launch import DESELECT_ARGS, external_run
from perf_plugin.run.writeback import WritebackRequest, write_back
from tests.test_msprof import (
    BENCH_TEST,
    CAST,
    MUL,
    cases_of,
    db_row,
    durations,
    launches,
    op_summary_text,
    read_db,
    write_db,
)

STANDIN_MSPROF = """\
#!{python}
# Stands in for msprof: runs the application with this environment, then exports a PROF_
# directory whose op_summary holds the rows of the kernel types whose cases passed in the session.
import csv, json, os, pathlib, subprocess, sys

args = sys.argv[1:]
options = []
while args and args[0].startswith("--"):
    options.append(args.pop(0))
output = pathlib.Path([o.split("=", 1)[1] for o in options if o.startswith("--output=")][0])
code = subprocess.call(args)
session = pathlib.Path(os.environ["PERF_MSPROF_RECORD"]) / "session.json"
records = json.loads(session.read_text())["records"].values() if session.is_file() else []
launched = set(record["ref"]["kernel_type"] for record in records if record["outcome"] == "passed")
lines = pathlib.Path(os.environ["STANDIN_OP_SUMMARY"]).read_text().splitlines(keepends=True)
column = next(csv.reader([lines[0]])).index("OP Type")
kept = [lines[0]] + [line for line in lines[1:] if next(csv.reader([line]))[column] in launched]
prof = output / "PROF_000001_20251127120000000_STANDIN"
(prof / "device_0").mkdir(parents=True)
(prof / "mindstudio_profiler_output").mkdir()
(prof / "mindstudio_profiler_output" / "op_summary_20251127120000.csv").write_text("".join(kept))
sys.exit(code)
"""

ABORTING_CONFTEST = """\
import os

def pytest_runtest_call(item):
    case = getattr(getattr(item, "callspec", None), "params", {}).get("kernel_case")
    if case is not None and case.ref.kernel_type in os.environ.get("ABORT_KERNEL_TYPES", "").split(","):
        os.abort()
"""


def project(tmp_path: Path, abort: str, standin: str = STANDIN_MSPROF) -> tuple[Path, list, dict[str, str]]:
    """A project with a Cast and a Mul row, the stand-in msprof on PATH, and the cases as the
    controller collects them (node id, case)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    msprof = bin_dir / "msprof"
    msprof.write_text(standin.format(python=sys.executable))
    msprof.chmod(msprof.stat().st_mode | stat.S_IXUSR)
    summary = tmp_path / "op_summary.csv"
    summary.write_text(op_summary_text())
    root = tmp_path / "project"
    root.mkdir()
    (root / "test_kernels.py").write_text(BENCH_TEST)
    (root / "conftest.py").write_text(ABORTING_CONFTEST)
    db = root / "db"
    write_db(db / "Mul.csv", [db_row(*MUL)])
    write_db(db / "Cast.csv", [dict(db_row(*CAST), **{"Output Data Types": "DT_BF16"})])
    cases = [(f"test_kernels.py::test_kernel_replay[{c.ref.case_id}]", c) for c in cases_of(db)]
    environ = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        STANDIN_OP_SUMMARY=str(summary),
        ABORT_KERNEL_TYPES=abort,
    )
    return db, cases, environ


def launch(tmp_path: Path, db: Path, cases: list, environ: dict[str, str]):  # type: ignore[no-untyped-def]
    argv = ["--database-path", str(db), "--repeat-count", "10", "--warmup-count", "3", "-p", "no:cacheprovider", "-q", "test_kernels.py"]
    return external_run(
        "launch", cases, repeat_count=10, warmup_count=3, argv=argv, cwd=db.parent,
        output_root=tmp_path / "msprof_output", environ=environ,
    )


def test_a_kernel_type_that_brings_its_session_down_costs_only_its_own_rows(tmp_path: Path) -> None:
    db, cases, environ = project(tmp_path, abort="Cast")
    nodeid = {case.ref.kernel_type: node for node, case in cases}
    cast_before = (db / "Cast.csv").read_bytes()

    outcome = launch(tmp_path, db, cases, environ)

    # the whole session, then Cast alone (which ends as early), then Mul alone
    runs = sorted((tmp_path / "msprof_output").glob("run_*"))
    assert [run.name.rsplit("_", 1)[-1] for run in runs if not run.name.split("_")[-1].isdigit()] == ["Cast", "Mul"]
    assert len(runs) == 3
    (mul_run,) = [run for run in runs if run.name.endswith("_Mul")]
    assert (mul_run / DESELECT_ARGS).read_text() == f"--deselect={nodeid['Cast']}\n"

    records = {record.ref.kernel_type: record for record in outcome.records.values()}
    assert records["Mul"].outcome == "passed"
    assert records["Cast"].outcome == "failed"
    assert records["Cast"].message.startswith("the session under msprof of Cast alone ended (exit code ")
    assert outcome.failed == 1
    (note,) = [n for n in outcome.notes if "each kernel type then ran in a session of its own" in n]
    assert note.startswith("msprof: the session under msprof ended (exit code ")
    assert ": Mul recorded; Cast (exit code " in note and "ended before recording too, their cases failed" in note

    write_back(WritebackRequest(db, "all", False, "20251127_120000"), outcome.results, [])
    mul = read_db(db / "Mul.csv")
    assert mul[0]["Average Duration(us)"] == format_number(sum(durations(launches(*MUL)[4:])) / 10)
    assert (db / "Cast.csv").read_bytes() == cast_before  # no Cast kernel was recorded: nothing written there


def test_when_every_kernel_type_brings_its_session_down_nothing_is_written(tmp_path: Path) -> None:
    db, cases, environ = project(tmp_path, abort="Cast,Mul")
    before = {p.name: p.read_bytes() for p in db.iterdir()}
    with pytest.raises(MsprofError) as info:
        launch(tmp_path, db, cases, environ)
    message = str(info.value)
    assert message.startswith("the session under msprof ended (exit code ")
    assert "and so did the session of each kernel type alone: Cast (exit code " in message
    assert message.endswith("; nothing was written")
    assert {p.name: p.read_bytes() for p in db.iterdir()} == before


def test_a_session_that_exits_cleanly_without_a_record_is_not_run_again(tmp_path: Path) -> None:
    db, cases, environ = project(tmp_path, abort="", standin=f"#!{sys.executable}\nimport sys\nsys.exit(0)\n")
    with pytest.raises(MsprofError, match=r"ended \(exit code 0\) before recording its results; nothing was written"):
        launch(tmp_path, db, cases, environ)
    assert len(list((tmp_path / "msprof_output").glob("run_*"))) == 1
