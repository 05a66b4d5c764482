"""Nothing measured is lost: the run journal, signals, a killed controller, a torn last line.

Real ``pytest bench`` sessions in subprocesses, on a database of real-format rows; the slow case
is a replay of the project's own (registered through ``pytest_perf_replay_modules``) that sleeps,
so a signal arrives while the run is measuring.  Every check of a written row compares its
``Average Duration(us)`` with the mean of the samples the journal holds for it.
"""

from __future__ import annotations

import csv
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import filelock
import pytest

from perf_plugin.database.schema import format_number
from perf_plugin.results import CaseRef, CaseResult, SampleStats
from perf_plugin.run.journal import (
    JournalHeader,
    RunJournal,
    journal_dir,
    pending_journals,
    read_journal,
)
from perf_plugin.run.recovery import kept_results, recover_journals

BENCH_TEST = (Path(__file__).parents[1] / "bench" / "test_kernels.py").read_text()
HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"
TANH_ROWS = [f'dynamic,CPU,"""{n},8""",FLOAT,ND,"""{n},8""",FLOAT,ND' for n in range(1, 9)]
ADD_ROWS = ['dynamic,AI_VECTOR_CORE,"""8,128;8,128""",FLOAT;FLOAT,ND;ND,"""8,128""",FLOAT,ND']
MATMUL_ROWS = ['dynamic,AI_CORE,"""32,64;64,16""",FLOAT;FLOAT,ND;ND,"""32,16""",FLOAT,ND']
TOTAL_ROWS = len(TANH_ROWS) + len(ADD_ROWS) + len(MATMUL_ROWS)
AVERAGE = "Average Duration(us)"

SLOW_REPLAYS = '''
"""Tanh, slowly: each call sleeps, so a run of a few rows lasts long enough to be interrupted."""
import os
import signal
import time

from perf_plugin.replay.base import CaseBuildError, OpReplay

SLEEP_S = float(os.environ.get("SLOW_TANH_S", "0.02"))
# STALL_AT_CALL=N: the N-th call in a process hangs for a minute (a long case), after touching
# stalled-<pid> in the working directory
STALL_AT = int(os.environ.get("STALL_AT_CALL", "0"))
# HOLD_AT_CALL=N: the N-th call in a process runs HOLD_S seconds (3) deaf to SIGINT and SIGTERM,
# as a long C++ kernel is (Python runs the handler when it returns), after touching holding-<pid>
HOLD_AT = int(os.environ.get("HOLD_AT_CALL", "0"))
HOLD_S = float(os.environ.get("HOLD_S", "3"))
DEAF = {signal.SIGINT, signal.SIGTERM}
CALLS = [0]

class SlowTanhReplay(OpReplay):
    kernel_types = ("Tanh",)

    def check(self, row):
        if len(row.present_inputs) != 1 or len(row.present_outputs) != 1:
            raise CaseBuildError("Tanh needs one input and one output")

    def make_inputs(self, row, device, generator):
        return (self.random(row.present_inputs[0], device, generator),)

    def run(self, x):
        CALLS[0] += 1
        if CALLS[0] == STALL_AT:
            open(f"stalled-{os.getpid()}", "w").close()
            time.sleep(60)
        if CALLS[0] == HOLD_AT:
            open(f"holding-{os.getpid()}", "w").close()
            signal.pthread_sigmask(signal.SIG_BLOCK, DEAF)
            try:
                time.sleep(HOLD_S)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, DEAF)
        time.sleep(SLEEP_S)
        return x.tanh()
'''

# The journal as it was when write-back finished (it is removed then), and, with
# SLOW_WRITEBACK_S, a write-back that says when it starts and waits before each file.
CONFTEST = '''
import os
import shutil
import time
from pathlib import Path

import perf_plugin.run.journal as journal
import perf_plugin.run.writeback as writeback

HERE = Path(__file__).parent


def pytest_perf_replay_modules(config):
    return ["slow_replays"]


def pytest_runtest_logreport(report):
    # every case that passed, as the process that ran it saw it (an xdist worker's reports may
    # never reach the controller once the run is interrupted)
    if report.when == "call" and report.passed:
        with open(HERE / "passed.txt", "a") as handle:
            handle.write(report.nodeid + "\\n")
        if "RANK" in os.environ:  # torchrun: which ranks have measured
            with open(HERE / f"passed-rank{os.environ['RANK']}.txt", "a") as handle:
                handle.write(report.nodeid + "\\n")


_mark_done = journal.RunJournal.mark_done


def _keep_a_copy(self):
    if self.started:
        shutil.copyfile(self.path, HERE / f"journal-at-end{os.environ.get('RANK', '')}.jsonl")  # torchrun: per rank
    _mark_done(self)


journal.RunJournal.mark_done = _keep_a_copy

SLOW = float(os.environ.get("SLOW_WRITEBACK_S", "0"))
if SLOW:
    _write_file = writeback._write_file

    def _slow_write_file(*args, **kwargs):
        (HERE / "writeback-started").touch()
        time.sleep(SLOW)
        return _write_file(*args, **kwargs)

    writeback._write_file = _slow_write_file
'''


# ----------------------------------------------------------------------------- helpers
def make_project(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "conftest.py").write_text(CONFTEST)
    (path / "slow_replays.py").write_text(SLOW_REPLAYS)
    (path / "test_kernels.py").write_text(BENCH_TEST)
    db = path / "db"
    db.mkdir()
    for name, rows in (("Tanh", TANH_ROWS), ("Add", ADD_ROWS), ("MatMulV2", MATMUL_ROWS)):
        (db / f"{name}.csv").write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH")])), **(extra or {})}


# pytest with Python's own SIGINT handler, whatever this process's is: a shell starts a background
# job (`pytest tests &`, nohup, some CI runners) with SIGINT ignored, and a Python started with it
# ignored never turns SIGINT into KeyboardInterrupt, which the signal tests depend on
PYTEST_WITH_SIGINT = "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); sys.exit(pytest.main())"
# pytest as a shell's background job starts it: SIGINT ignored, which its xdist workers inherit
PYTEST_AS_BACKGROUND_JOB = "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.SIG_IGN); sys.exit(pytest.main())"


def start_bench(project: Path, *args: str, env: dict[str, str] | None = None, batch: int = 1,
                own_group: bool = False, background: bool = False) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-c", PYTEST_AS_BACKGROUND_JOB if background else PYTEST_WITH_SIGINT, "test_kernels.py", "--perf-database-path", "db", "--perf-repeat-count",
        "3", "--perf-warmup-count", "1", "--perf-profile-batch-size", str(batch), "-p", "no:cacheprovider", *args,
    ]
    return subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env({"PYTHONPATH": str(project), **(env or {})}), start_new_session=own_group)


def run_bench(project: Path, *args: str) -> tuple[int, str]:
    process = start_bench(project, *args)
    output = process.communicate(timeout=120)[0]
    return process.returncode, output


def perfdb(*args: str | Path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "perf_plugin.cli", *map(str, args)], capture_output=True, text=True, check=False,
                          timeout=120, env=_env())
    return done.returncode, done.stdout + done.stderr


def journaled(db: Path) -> int:
    """Result lines in the journals of the database (the header line not counted)."""
    return sum(max(p.read_bytes().count(b"\n") - 1, 0) for p in pending_journals(db))


def wait_for(condition: Callable[[], bool], process: subprocess.Popen[str], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended first:\n{process.communicate()[0]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out:\n{process.communicate()[0]}")
        time.sleep(0.01)


def rows_of(db: Path) -> dict[str, list[dict[str, str]]]:
    return {p.name: list(csv.DictReader(p.open(newline=""))) for p in sorted(db.glob("*.csv"))}


def csv_bytes(db: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(db.glob("*.csv"))}


def assert_written(db: Path, results: list[CaseResult]) -> None:
    """Each result's row holds the mean of its samples (rows are found by their line)."""
    tables = rows_of(db)
    assert results
    for result in results:
        assert result.ref.row_line is not None
        row = tables[result.ref.csv_file][result.ref.row_line - 2]
        assert row[AVERAGE] == format_number(SampleStats.of(result.samples_us).mean), result.ref.case_id


def measured_lines(db: Path) -> set[tuple[str, int]]:
    return {(name, i + 2) for name, rows in rows_of(db).items() for i, row in enumerate(rows) if row.get(AVERAGE)}


def lines_of(results: list[CaseResult]) -> set[tuple[str, int]]:
    return {(r.ref.csv_file, r.ref.row_line or 0) for r in results}


# ----------------------------------------------------------------------------- the journal itself
def _result(case_id: str, line: int, samples: tuple[float, ...], outcome: str = "passed") -> CaseResult:
    return CaseResult(CaseRef(case_id, "Tanh", "Tanh.csv", line, f"sig-{line}"), outcome, backend="cpu",
                      samples_us=samples)


def _header() -> JournalHeader:
    return JournalHeader("db", "all", "20250101_000000", "2025-01-01T00:00:00+00:00", ["pytest", "bench"], "cpu")


def test_journal_lines_round_trip_and_a_torn_last_line_is_a_note(tmp_path: Path) -> None:
    journal = RunJournal(tmp_path, "run-1", _header())
    journal.append([_result("a", 2, (1.0, 2.0)), _result("b", 3, (), "failed")])
    journal.append([_result("b", 3, (4.0,))])  # measured after all: replaces the failure
    journal.close()
    assert journal.path.read_bytes().count(b"\n") == 4  # header + three results
    with journal.path.open("ab") as handle:
        handle.write(b'{"ref": {"case_id": "c"')  # the write a power cut interrupted
    contents = read_journal(journal.path)
    assert contents.header == _header()
    assert [r.ref.case_id for r in contents.results] == ["a", "b", "b"]
    assert contents.notes == [f"{journal.path}: torn last line 5 ignored (23 bytes, no line end)"]
    assert [(r.ref.case_id, r.samples_us) for r in kept_results(contents.results)] == [("a", (1.0, 2.0)), ("b", (4.0,))]


def test_a_journal_whose_run_is_alive_is_left_alone(tmp_path: Path) -> None:
    journal = RunJournal(journal_dir(tmp_path), "run-1", _header())
    journal.append([_result("a", 2, (1.0,))])
    (recovered,) = recover_journals(tmp_path, lock_timeout=1)
    assert recovered.live and journal.path.exists()
    journal.close()  # its process gone: the lock is free
    (recovered,) = recover_journals(tmp_path, lock_timeout=1)
    assert recovered.written and not journal.path.exists() and not list(journal_dir(tmp_path).iterdir())


def test_a_journal_that_cannot_be_written_stops_journaling_not_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    journal = RunJournal(blocker / ".perf-journal", "run-1", _header())
    journal.append([_result("a", 2, (1.0,))])
    assert journal.error is not None and not journal.started
    journal.append([_result("b", 3, (1.0,))])  # no second attempt, no exception


# ----------------------------------------------------------------------------- signals
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_run_writes_back_what_was_measured_and_missing_only_finishes(
    tmp_path: Path, signum: signal.Signals
) -> None:
    project = make_project(tmp_path / "project")
    db = project / "db"
    process = start_bench(project)
    wait_for(lambda: journaled(db) >= 3, process)
    process.send_signal(signum)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "KeyboardInterrupt" in output and "write-back (all): " in output, output

    contents = read_journal(project / "journal-at-end.jsonl")  # as write-back left it, then removed
    assert contents.notes == [] and contents.header is not None and contents.header.update_mode == "all"
    results = kept_results(contents.results)
    assert 3 <= len(results) < TOTAL_ROWS, output  # the signal came mid-run
    assert not pending_journals(db)
    assert_written(db, results)
    assert measured_lines(db) == lines_of(results)  # every measured row, and nothing else

    code, output = run_bench(project, "--perf-update-mode", "missing-only")
    assert code == 0, output
    assert f"{TOTAL_ROWS - len(results)} passed, {len(results)} skipped" in output, output
    assert_written(db, results)  # the interrupted run's values stay
    assert len(measured_lines(db)) == TOTAL_ROWS


def _case_id(nodeid: str) -> str:
    return nodeid.split("[", 1)[1][:-1]


@pytest.mark.parametrize("signum,to_group,background", [
    (signal.SIGINT, True, False), (signal.SIGTERM, False, False), (signal.SIGTERM, False, True),
], ids=["Ctrl-C to the process group", "SIGTERM to pytest alone", "SIGTERM to a background job"])
def test_an_interrupt_under_xdist_writes_back_every_case_a_worker_measured(
    tmp_path: Path, signum: signal.Signals, to_group: bool, background: bool
) -> None:
    """The workers' results sit in their profiler batches (32 cases a batch here) when the
    interrupt comes: the workers flush them into their journals, the controller writes them.
    A background job's workers start with SIGINT ignored, which xdist stops a busy worker with."""
    project = make_project(tmp_path / "project")
    passed_file = project / "passed.txt"
    # a background job's run is stopped with its workers in the middle of a long case: xdist
    # interrupts them with SIGINT, which they inherited ignored
    stall = {"STALL_AT_CALL": "12"} if background else {}
    process = start_bench(project, "-n", "2", batch=32, own_group=to_group, env={"SLOW_TANH_S": "0.1", **stall},
                          background=background)

    def passed() -> set[str]:
        return set(passed_file.read_text().split()) if passed_file.exists() else set()

    wait_for(lambda: len(passed()) >= 3 and (not background or any(project.glob("stalled-*"))), process, timeout=180)
    if to_group:
        os.killpg(process.pid, signum)  # what a terminal's Ctrl-C does: every process of the run
    else:
        process.send_signal(signum)  # a scheduler's stop: the workers hear of it from xdist
    output = process.communicate(timeout=120)[0]
    assert_every_passed_case_written(project, process.returncode, output)


def assert_every_passed_case_written(project: Path, returncode: int, output: str) -> None:
    """The run ended interrupted, with every case a process saw pass in the database and in the
    summary lines; a case the interrupt stopped counted neither crashed nor failed."""
    db = project / "db"
    passed_file = project / "passed.txt"
    assert returncode == pytest.ExitCode.INTERRUPTED, output
    passed = set(passed_file.read_text().split()) if passed_file.exists() else set()
    results = kept_results(read_journal(project / "journal-at-end.jsonl").results)
    assert {_case_id(nodeid) for nodeid in passed} <= {r.ref.case_id for r in results}, output
    assert len(results) < TOTAL_ROWS, output  # the interrupt came mid-run
    assert not pending_journals(db)  # the workers' journals were taken and removed
    assert_written(db, results)
    assert measured_lines(db) == lines_of(results)
    summary = f"interrupted: {len(results)} case(s) measured, {len(results)} row(s) written, {TOTAL_ROWS - len(results)} case(s) left"
    assert summary in output, output
    last = output.strip().splitlines()[-1]
    assert f"{len(results)} measured, {len(results)} written, {TOTAL_ROWS - len(results)} left for missing-only" in last, output
    # a case the interrupt stopped is not a crash nor a failure: it was not measured
    assert "crashed while running" not in output and " failed" not in last, output


@pytest.mark.parametrize("signum,to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["Ctrl-C to the process group", "SIGTERM to pytest alone"])
def test_an_interrupt_under_xdist_waits_for_a_worker_inside_a_long_kernel(
    tmp_path: Path, signum: signal.Signals, to_group: bool
) -> None:
    """A worker deaf to signals for 20 s (one long kernel; a CPU's bf16 GEMM under load): xdist,
    interrupted, tears its workers down and kills one still busy 10 s later, with the cases it
    measured since its last batch.  The first interrupt lets each worker end its case instead."""
    project = make_project(tmp_path / "project")
    process = start_bench(project, "-n", "2", batch=32, own_group=to_group,
                          env={"SLOW_TANH_S": "0.1", "HOLD_AT_CALL": "8", "HOLD_S": "20"})
    wait_for(lambda: any(project.glob("holding-*")), process, timeout=180)
    if to_group:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    output = process.communicate(timeout=120)[0]
    assert_every_passed_case_written(project, process.returncode, output)
    assert "each worker ends the case it is in" in output, output


def test_a_case_an_interrupt_stops_under_xdist_is_reported_not_measured_not_crashed(tmp_path: Path) -> None:
    """SIGINT to a background job's process group (its controller ignores it, its workers hear
    it) reaches a worker inside a long kernel, which hears it only when the kernel returns: xdist
    reports the case a worker was running when its session ended interrupted as a crash; it was
    stopped, not crashed, and is left for the next run."""
    project = make_project(tmp_path / "project")
    process = start_bench(project, "-n", "2", "-rs", own_group=True, background=True,
                          env={"SLOW_TANH_S": "0.1", "HOLD_AT_CALL": "8"})
    wait_for(lambda: any(project.glob("holding-*")), process, timeout=180)
    os.killpg(process.pid, signal.SIGINT)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "crashed while running" not in output and "took its worker down" not in output, output
    assert "interrupted while it ran, not measured (--perf-update-mode missing-only measures it)" in output, output
    assert " failed" not in output.strip().splitlines()[-1], output


TORCHRUN_WITH_SIGINT = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'torchrun'; runpy.run_module('torch.distributed.run', run_name='__main__', alter_sys=True)"
)


def test_ctrl_c_under_torchrun_writes_back_every_case_each_rank_measured(tmp_path: Path) -> None:
    """Ctrl-C reaches every rank, then torchrun's agent sends them SIGTERM: each rank flushes
    its profiler, the others hand their results to rank 0, and rank 0 writes them all."""
    project = make_project(tmp_path / "project")
    db = project / "db"
    passed_file = project / "passed.txt"
    command = [
        sys.executable, "-c", TORCHRUN_WITH_SIGINT, "--standalone", "--nproc-per-node", "2", "-m", "pytest",
        "test_kernels.py", "--perf-database-path", "db", "--perf-repeat-count", "3", "--perf-warmup-count", "1",
        "-p", "no:cacheprovider",
    ]
    env = {k: v for k, v in _env({"PYTHONPATH": str(project), "SLOW_TANH_S": "0.1", "OMP_NUM_THREADS": "1"}).items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    process = subprocess.Popen(command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env, start_new_session=True)

    def passed() -> set[str]:
        return set(passed_file.read_text().split()) if passed_file.exists() else set()

    # each rank has measured a case (on a loaded machine one rank can start seconds after the other)
    wait_for(lambda: len(passed()) >= 3 and all((project / f"passed-rank{rank}.txt").exists() for rank in (0, 1)),
             process, timeout=180)
    os.killpg(process.pid, signal.SIGINT)
    output = process.communicate(timeout=120)[0]
    at_end = project / "journal-at-end0.jsonl"  # rank 0's, with rank 1's
    assert at_end.exists(), output
    results = kept_results(read_journal(at_end).results)
    assert {_case_id(nodeid) for nodeid in passed()} <= {r.ref.case_id for r in results}, output
    assert len(results) < TOTAL_ROWS, output
    assert not pending_journals(db), output  # rank 1's journal went once rank 0 took its results
    assert_written(db, results)
    assert measured_lines(db) == lines_of(results)
    assert "went to rank 0" in output, output
    assert f"interrupted: {len(results)} case(s) measured, {len(results)} row(s) written, {TOTAL_ROWS - len(results)} case(s) left" in output, output


# ----------------------------------------------------------------------------- a killed controller
@pytest.fixture(scope="module")
def killed_mid_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose run was killed (-9) while measuring: its CSVs as they were, its journal left."""
    project = make_project(tmp_path_factory.mktemp("killed") / "project")
    process = start_bench(project)
    wait_for(lambda: journaled(project / "db") >= 3, process)
    process.kill()
    process.communicate(timeout=30)
    return project


def _copy(project: Path, to: Path) -> Path:
    return Path(shutil.copytree(project, to))


def _journal_results(db: Path) -> list[CaseResult]:
    (path,) = pending_journals(db)
    contents = read_journal(path)
    assert not contents.notes
    return kept_results(contents.results)


def test_perfdb_resume_writes_a_killed_run_s_journal_torn_line_and_all(killed_mid_run: Path, tmp_path: Path) -> None:
    project = _copy(killed_mid_run, tmp_path / "project")
    db = project / "db"
    assert measured_lines(db) == set()  # killed before write-back: nothing written
    results = _journal_results(db)
    assert 3 <= len(results) < TOTAL_ROWS
    (path,) = pending_journals(db)
    with path.open("ab") as handle:
        handle.write(b'{"ref":{"case_id":"Tanh-9')  # and a power cut tore the last write

    code, output = perfdb("resume", db, "--dry-run")
    assert code == 0 and "(dry run: nothing written)" in output and measured_lines(db) == set(), output
    code, output = perfdb("resume", db)
    assert code == 0, output
    assert "torn last line" in output and f"{len(results)} measured result(s)" in output, output
    assert_written(db, results)
    assert measured_lines(db) == lines_of(results)
    assert not list(journal_dir(db).iterdir())  # journal and its lock file gone
    assert perfdb("resume", db) == (0, f"{db}: no unfinished runs ({journal_dir(db)} holds no journal)\n")


def test_the_next_run_writes_a_killed_run_s_journal_before_measuring_the_rest(
    killed_mid_run: Path, tmp_path: Path
) -> None:
    project = _copy(killed_mid_run, tmp_path / "project")
    db = project / "db"
    results = _journal_results(db)
    code, output = run_bench(project, "--perf-update-mode", "missing-only")
    assert code == 0, output
    assert "recovered an unfinished run's journal" in output, output
    assert f"{TOTAL_ROWS - len(results)} passed, {len(results)} skipped" in output, output
    assert_written(db, results)  # the killed run's values, not measured again
    assert len(measured_lines(db)) == TOTAL_ROWS and not pending_journals(db)


def _pad(db: Path, rows: int) -> None:
    """A large database: more rows of other shapes in every CSV (write-back takes a while)."""
    for path in db.glob("*.csv"):
        extra = [f'dynamic,CPU,"""{n},{n % 7 + 1}""",FLOAT,ND,"""{n},3""",FLOAT,ND' for n in range(1000, 1000 + rows)]
        with path.open("a") as handle:
            handle.write("\n".join(extra) + "\n")


def _timed(*args: str | Path) -> float:
    start = time.monotonic()
    code, output = perfdb(*args)
    assert code == 0, output
    return time.monotonic() - start


def test_kill_9_during_write_back_never_tears_a_csv_nor_loses_a_journaled_result(
    killed_mid_run: Path, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    pristine = _copy(killed_mid_run, tmp_path / "pristine") / "db"
    _pad(pristine, 6000)
    results = _journal_results(pristine)
    old = csv_bytes(pristine)
    reference = _copy(pristine, tmp_path / "reference")
    start_up = _timed("resume", tmp_path)  # the command with nothing to write: its start-up
    whole = _timed("resume", reference)
    new = csv_bytes(reference)
    assert set(new) == set(old) and all(new[name] != old[name] for name in new)

    work = _copy(pristine, tmp_path / "work")
    states: list[str] = []
    for _ in range(20):
        process = subprocess.Popen([sys.executable, "-m", "perf_plugin.cli", "resume", str(work)], env=_env(),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.8 * start_up, whole))
        process.send_signal(signal.SIGKILL)
        process.wait()
        now = csv_bytes(work)
        assert set(now) == set(old), f"seed {seed}"
        for name, data in now.items():
            assert data in (old[name], new[name]), f"{name} is neither the old nor the new file (seed {seed})"
        if not pending_journals(work):  # it finished before the kill: everything written
            assert now == new, f"seed {seed}"
            states.append("done")
            shutil.rmtree(work)
            work = _copy(pristine, tmp_path / "work")
        else:
            states.append("".join("n" if now[name] == new[name] else "o" for name in sorted(now)))
    assert perfdb("resume", work)[0] == 0
    assert csv_bytes(work) == new, f"seed {seed}"
    assert_written(work, results)
    # some kills landed between two files of one write-back (the journal still there, a file new)
    assert any("n" in state for state in states if state != "done"), (seed, states)


def test_kill_9_of_pytest_during_its_own_write_back(tmp_path: Path) -> None:
    """The controller itself killed while writing: each CSV is the old file or what the run
    writes, and perfdb resume then gives exactly what an unbroken write-back of the journal does."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    slow = 0.15
    project = make_project(tmp_path / "project")
    db = project / "db"
    old = csv_bytes(db)
    process = start_bench(project, env={"SLOW_WRITEBACK_S": str(slow)})
    wait_for(lambda: (project / "writeback-started").exists(), process)
    time.sleep(rng.uniform(0.0, 2.5 * slow))  # three files, each written after its wait
    process.send_signal(signal.SIGKILL)
    process.wait()
    results = _journal_results(db)
    assert len(results) == TOTAL_ROWS
    (journal,) = pending_journals(db)
    header = read_journal(journal).header
    assert header is not None

    reference = _copy(db, tmp_path / "reference")
    assert perfdb("resume", reference)[0] == 0
    new = csv_bytes(reference)
    for name, data in csv_bytes(db).items():
        if data == old[name]:
            continue
        # the run stamps rows when it writes them, a resume with the run's start: nothing else differs
        (stamp,) = {row["MicroBench Timestamp"] for row in csv.DictReader(data.decode().splitlines())}
        assert data == new[name].replace(header.timestamp.encode(), stamp.encode()), f"{name} (seed {seed})"
    assert perfdb("resume", db)[0] == 0
    assert csv_bytes(db) == new
    assert_written(db, results)


def test_a_journal_is_left_for_later_when_write_back_cannot_take_the_lock(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    db = project / "db"
    with filelock.FileLock(str(db / ".perfdb.lock")):
        code, output = run_bench(project, "--perf-lock-timeout", "0.2", "-k", "Add or MatMul")
    assert code == pytest.ExitCode.TESTS_FAILED and "write-back failed" in output, output
    assert "measured results kept in" in output, output
    results = _journal_results(db)
    assert len(results) == 2 and measured_lines(db) == set()
    code, output = perfdb("resume", db)
    assert code == 0, output
    assert_written(db, results)
