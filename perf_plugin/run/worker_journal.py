"""Each xdist worker journals what it measured, so an interrupted ``-n N`` run loses none of it.

Under pytest-xdist a worker's results reach the controller on test reports, and its last batch
(the cases its profiler session had measured, not yet processed) at the end of its session.  An
interrupt cut both: the controller stops reading reports the moment it is interrupted and tears
the workers down, so results already measured died with the workers (Ctrl-C after 12 s of
``pytest bench -n 2``: 38 cases passed, 0 written).

So every worker also appends its results, as it hands them on, to a journal of its own beside
the controller's: ``<run id>.<worker id>.jsonl``, same header, same format
(``perf_plugin.run.journal``).  A worker that is interrupted (its own Ctrl-C, SIGTERM, or xdist's
shutdown, which interrupts a worker still running a case) flushes its profiler into that journal
before it exits.  At the end of the session the controller reads the journals of its workers,
takes every result it did not receive, journals them in its own journal and removes theirs; then
write-back writes them as usual.  A run killed outright leaves the workers' journals as it leaves
its own: the next run, or ``perfdb resume``, writes them back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import filelock
import pytest

from perf_plugin.results import CaseResult
from perf_plugin.run.interrupt import worker_interrupts
from perf_plugin.run.journal import (
    JOURNAL_SUFFIX,
    JournalHeader,
    RunJournal,
    lock_path_of,
    read_journal,
)
from perf_plugin.run.state import ControllerState, RunState

WORKERINPUT_KEY = "perf_journal"
LOCK_WAIT_S = 5.0  # a worker still exiting holds its journal's lock this long at most, in practice


def worker_input(control: ControllerState) -> dict[str, Any] | None:
    """Controller: what a worker needs to journal beside the controller's journal (None: the run
    keeps no journal, e.g. ``--perf-no-writeback``)."""
    journal = control.journal
    if journal is None:
        return None
    return {"dir": str(journal.path.parent), "run_id": journal.path.stem, "header": journal.header.to_json()}


def open_worker_journal(workerinput: dict[str, Any]) -> RunJournal | None:
    """Worker: its journal (created on its first results), or None when the run keeps none."""
    data = workerinput.get(WORKERINPUT_KEY)
    if not data:
        return None
    worker = str(workerinput.get("workerid", "gw0"))
    return RunJournal(Path(data["dir"]), f"{data['run_id']}.{worker}", JournalHeader.from_json(data["header"]))


def start_worker_journal(config: pytest.Config, state: RunState, workerinput: dict[str, Any]) -> None:
    """Worker: its own journal of what it measured, and SIGTERM ending it through its session end
    (which flushes the profiler into that journal), as Ctrl-C does; one interrupt, however often
    it arrives, stops it once (``worker_interrupts``)."""
    state.worker_journal = open_worker_journal(workerinput)
    worker_interrupts(config, sigterm=state.worker_journal is not None)
    if state.worker_journal is not None:
        config.add_cleanup(state.worker_journal.close)  # kept: the controller takes it, or a later run


def worker_journals(control: ControllerState) -> list[Path]:
    """The journals this run's workers left, by worker id."""
    journal = control.journal
    if journal is None or not journal.path.parent.is_dir():
        return []
    pattern = f"{journal.path.stem}.*{JOURNAL_SUFFIX}"
    return sorted(p for p in journal.path.parent.glob(pattern) if p != journal.path)


def absorb_worker_journals(control: ControllerState) -> tuple[int, list[str]]:
    """Controller, at the end of the session: the results its workers journaled but never
    delivered, taken into its state (and its own journal); the workers' journals removed once
    the controller's holds them.  (Results taken, lines for the terminal.)"""
    taken = 0
    lines: list[str] = []
    for path in worker_journals(control):
        lock = filelock.FileLock(str(lock_path_of(path)))
        try:
            lock.acquire(timeout=LOCK_WAIT_S)
        except filelock.Timeout:
            lines.append(f"{path.name}: its worker is still running; left for the next run or perfdb resume")
            continue
        try:
            contents = read_journal(path)
            lines.extend(contents.notes)
            new = [r for r in contents.results if _adds(control, r)]
            control.add_results(new)
            taken += sum(1 for r in new if r.has_duration)
            journal = control.journal
            if journal is not None and journal.error is None:  # the controller's journal holds them now
                path.unlink()
        finally:
            lock.release()
        if not path.exists():
            lock_path_of(path).unlink(missing_ok=True)
    return taken, lines


def _adds(control: ControllerState, result: CaseResult) -> bool:
    """A worker's result the controller lacks: a case it has no result of, or one it has only
    without a duration (the measured one wins, as write-back would choose)."""
    previous = control.results.get(result.ref.case_id)
    return previous is None or (result.has_duration and not previous.has_duration)
