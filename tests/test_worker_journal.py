"""The xdist workers' journals: what the controller takes from them at the end of a session, and
write-back of results whose reports never reached the controller.

Plain functions on real journal files; the interrupted ``-n 2`` runs themselves are in
``test_journal.py``.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import filelock

from perf_plugin import options
from perf_plugin.database.paths import explicit_location
from perf_plugin.results import CaseRef, CaseResult
from perf_plugin.run.cases import load_case_set
from perf_plugin.run.controller import finish_run
from perf_plugin.run.journal import JournalHeader, RunJournal, journal_dir, lock_path_of, pending_journals
from perf_plugin.run.state import ControllerState, RunState
from perf_plugin.run.worker_journal import absorb_worker_journals, open_worker_journal, worker_input

HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"


def _result(case_id: str, line: int, samples: tuple[float, ...] = (2.0, 4.0), outcome: str = "passed") -> CaseResult:
    return CaseResult(CaseRef(case_id, "Tanh", "Tanh.csv", line, f"sig-{line}"), outcome, backend="cpu",
                      samples_us=samples)


def _controller(database: Path) -> ControllerState:
    header = JournalHeader(str(database), "all", "20250101_000000", "2025-01-01T00:00:00+00:00", ["pytest"], "cpu")
    return ControllerState(journal=RunJournal(journal_dir(database), "20250101_000000-42", header))


def _worker_journal(control: ControllerState, worker: str) -> RunJournal:
    data = worker_input(control)
    assert data is not None
    journal = open_worker_journal({"perf_journal": data, "workerid": worker})
    assert journal is not None
    return journal


def test_the_controller_takes_what_its_workers_journaled_and_removes_their_journals(tmp_path: Path) -> None:
    control = _controller(tmp_path)
    control.add_results([_result("a", 2)])  # reached the controller on a report
    gw0, gw1 = _worker_journal(control, "gw0"), _worker_journal(control, "gw1")
    gw0.append([_result("a", 2), _result("b", 3)])  # a: delivered too; b: its report never came
    gw1.append([_result("c", 4, (), "failed")])
    gw1.append([_result("c", 4)])  # measured on a retry: the measured one wins
    gw0.close()
    gw1.close()
    assert [p.name for p in pending_journals(tmp_path)] == [
        "20250101_000000-42.gw0.jsonl", "20250101_000000-42.gw1.jsonl", "20250101_000000-42.jsonl",
    ]

    taken, lines = absorb_worker_journals(control)
    assert taken == 2 and lines == []
    assert sorted(control.results) == ["a", "b", "c"] and control.results["c"].has_duration
    assert [p.name for p in pending_journals(tmp_path)] == ["20250101_000000-42.jsonl"]  # it holds them now
    assert not lock_path_of(gw0.path).exists() and not lock_path_of(gw1.path).exists()


def test_a_worker_still_holding_its_journal_is_left_for_later(tmp_path: Path, monkeypatch: Any) -> None:
    control = _controller(tmp_path)
    gw0 = _worker_journal(control, "gw0")
    gw0.append([_result("b", 3)])  # its lock is held: the worker is alive
    monkeypatch.setattr("perf_plugin.run.worker_journal.LOCK_WAIT_S", 0.05)
    taken, lines = absorb_worker_journals(control)
    assert taken == 0 and control.results == {}
    assert lines == ["20250101_000000-42.gw0.jsonl: its worker is still running; left for the next run or perfdb resume"]
    assert gw0.path.exists()
    gw0.close()
    lock = filelock.FileLock(str(lock_path_of(gw0.path)))
    lock.acquire(timeout=0)
    lock.release()


def test_no_journal_no_worker_journal(tmp_path: Path) -> None:
    assert worker_input(ControllerState()) is None
    assert open_worker_journal({"workerid": "gw0"}) is None
    assert absorb_worker_journals(ControllerState()) == (0, [])


def _run_state(database: Path) -> RunState:
    values = {spec.field: spec.default for spec in options.OPTIONS}
    values.update(database_root=database, database_path=database)
    settings = options.Settings(**values)
    return RunState(settings, explicit_location(database), "cpu", "CPU_X86_64", _controller(database))


def test_results_whose_reports_never_came_are_written_back(tmp_path: Path) -> None:
    """An interrupt stopped every report before the controller saw one: it holds results, no records."""
    database = tmp_path / "db"
    database.mkdir()
    (database / "Tanh.csv").write_text(HEADER + '\ndynamic,CPU,"""2,8""",FLOAT,ND,"""2,8""",FLOAT,ND\n')
    (case,) = load_case_set(database, lambda kernel_type: None).cases  # the row's identity, as collection makes it
    state = _run_state(database)
    state.control.selected_cases = 3
    state.control.add_results([CaseResult(case.ref, "passed", backend="cpu", samples_us=(2.0, 4.0))])
    outcome = finish_run(state, collect_only=False, command=["pytest", "bench"], interrupted=True)
    assert not outcome.writeback_failed, outcome.lines
    with (database / "Tanh.csv").open(newline="") as handle:
        (row,) = csv.DictReader(handle)
    assert row["Average Duration(us)"] == "3"
    assert outcome.interrupted is not None
    assert (outcome.interrupted.measured, outcome.interrupted.written, outcome.interrupted.left) == (1, 1, 2)
    assert "interrupted: 1 case(s) measured, 1 row(s) written, 2 case(s) left; " in "\n".join(outcome.lines)
    assert pending_journals(database) == []  # written: the journal went
