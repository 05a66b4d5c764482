"""Journals of runs that never finished writing back, written back; and a new run's journal.

A journal left in ``<database>/.perf-journal`` whose lock nobody holds belongs to a run that
ended before its write-back finished (killed, a power cut, write-back failed).  Its results are
written back as that run would have written them (its update mode, its start time in the
timestamp column, no pruning and no quarantine: a later run does those), then the journal is
removed.  Writing one twice writes the same cells again, so a recovery that is itself killed is
simply done again.  A journal whose lock is held belongs to a session still running beside
this one and is left alone.

``begin_run`` does this at the start of every ``pytest bench`` run that writes back (before
the cases are collected, so ``--update-mode missing-only`` sees the recovered durations) and
gives the run a journal of its own; ``perfdb resume`` does it on demand.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import filelock

from perf_plugin.database.errors import DatabaseError
from perf_plugin.results import CaseResult, FileWriteback
from perf_plugin.run.interrupt import sigterm_as_interrupt
from perf_plugin.run.journal import (
    JournalHeader,
    RunJournal,
    journal_dir,
    lock_path_of,
    pending_journals,
    read_journal,
)
from perf_plugin.run.state import ControllerState, RunState
from perf_plugin.run.writeback import WritebackRequest, write_back

if TYPE_CHECKING:
    import pytest


@dataclass
class Recovered:
    """What became of one journal."""

    path: Path
    header: JournalHeader | None = None
    results: int = 0  # results with a duration, after a later result of a case replaced an earlier
    files: list[FileWriteback] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    live: bool = False  # its run is still going: left alone
    written: bool = False  # written back and removed (or would be, in a dry run)

    def describe(self) -> str:
        if self.live:
            return f"{self.path.name}: its run is still going (lock held), left alone"
        if self.header is None:
            return f"{self.path.name}: no readable header, left alone"
        origin = f"run started {self.header.started_at} ({' '.join(self.header.command)})"
        if not self.files and self.written:
            return f"{self.path.name}: {self.results} measured result(s) of {origin}, nothing to write"
        updated = sum(f.rows_updated for f in self.files)
        appended = sum(f.rows_appended for f in self.files)
        written = sum(1 for f in self.files if f.written)
        unmatched = sum(len(f.unmatched_samples) for f in self.files)
        extra = f", {unmatched} matched no row to fill" if unmatched else ""
        return (
            f"{self.path.name}: {self.results} measured result(s) of {origin} written back"
            f" ({self.header.update_mode}): {written} file(s) written, {updated} rows updated,"
            f" {appended} appended{extra}"
        )


def kept_results(results: list[CaseResult]) -> list[CaseResult]:
    """The results a run would have kept: the controller's own rule, applied in journal order."""
    control = ControllerState()
    control.add_results(results)
    return [r for r in control.results.values() if r.has_duration]


def recover_journal(database: Path, path: Path, *, lock_timeout: float, dry_run: bool = False) -> Recovered:
    outcome = Recovered(path)
    lock = filelock.FileLock(str(lock_path_of(path)))
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        outcome.live = True
        return outcome
    try:
        if not path.exists():  # its run finished while this one waited for the lock
            outcome.written = True
            return outcome
        contents = read_journal(path)
        outcome.header, outcome.notes = contents.header, contents.notes
        if contents.header is None:
            return outcome
        results = kept_results(contents.results)
        outcome.results = len(results)
        if not dry_run:
            if results:
                # the directory it lies in, not the header's (a database may have been moved)
                request = WritebackRequest(database, contents.header.update_mode, False, contents.header.timestamp,
                                           lock_timeout)
                outcome.files, _ = write_back(request, results, [])
            path.unlink()
        outcome.written = True
    finally:
        lock.release()
    if outcome.written and not dry_run:
        try:
            lock_path_of(path).unlink()
        except FileNotFoundError:
            pass
    return outcome


def recover_journals(database: Path, *, lock_timeout: float, dry_run: bool = False) -> list[Recovered]:
    """Every journal left in ``database``, oldest first (a later run's values land last)."""
    return [
        recover_journal(database, path, lock_timeout=lock_timeout, dry_run=dry_run)
        for path in pending_journals(database)
    ]


def _run_id(started: float) -> str:
    stamp = datetime.fromtimestamp(started, timezone.utc).strftime("%Y%m%d_%H%M%S")
    return f"{stamp}-{os.getpid()}"


def run_header(state: RunState, command: list[str], timestamp: str | None = None) -> JournalHeader:
    """The header naming a run in its journal (and in its --perf-results-out file): the rows'
    timestamp is the run's start unless one is given."""
    started = datetime.fromtimestamp(state.started, timezone.utc)
    return JournalHeader(
        database=str(state.location.directory),
        update_mode=state.settings.update_mode,
        timestamp=timestamp or started.strftime("%Y%m%d_%H%M%S"),
        started_at=started.isoformat(timespec="seconds"),
        command=command,
        backend=state.backend_name,
    )


def begin_run(config: pytest.Config, state: RunState, command: list[str]) -> None:
    """Controller, once per run, before its cases are collected: write back the journals of
    runs that did not finish, and open this run's journal (nothing on disk until a result)."""
    from perf_plugin.profiling.msprof import is_msprof_child

    control = state.controller
    if control is None or control.journal is not None or control.journal_checked:
        return
    control.journal_checked = True
    database = state.location.directory
    if state.settings.no_writeback or config.option.collectonly or is_msprof_child():
        left = pending_journals(database)
        if left and not is_msprof_child():
            state.notes.append(
                f"{len(left)} journal(s) of unfinished runs left in {journal_dir(database)}:"
                f" a run that writes back, or perfdb resume {database}, writes them"
            )
        return
    try:
        for item in recover_journals(database, lock_timeout=state.settings.lock_timeout):
            if not item.live:
                state.notes.append(f"recovered an unfinished run's journal: {item.describe()}")
            state.notes.extend(item.notes)
    except (DatabaseError, OSError) as exc:
        state.notes.append(f"journals of unfinished runs not written back: {exc}; perfdb resume {database} retries")
    journal = RunJournal(journal_dir(database), _run_id(state.started), run_header(state, command))
    control.journal = journal
    config.add_cleanup(journal.close)  # a run whose write-back failed leaves it for the next
    sigterm_as_interrupt(config)  # SIGTERM, like Ctrl-C, ends the run through write-back


def settle_journal(control: ControllerState, written: bool) -> list[str]:
    """Session end: the journal goes once its results are in the CSVs (or it holds none);
    lines for the terminal when it stays, or when it could not be kept."""
    journal = control.journal
    if journal is None:
        return []
    lines = [f"journal not kept, results were in memory only: {journal.error}"] if journal.error else []
    if written or not any(r.has_duration for r in control.results.values()):
        journal.mark_done()
    else:
        journal.close()
        if journal.started and journal.error is None:
            database = Path(journal.header.database)
            lines.append(f"measured results kept in {journal.path}: the next run or perfdb resume {database} writes them")
    return lines
