"""The run journal: every result the controller receives, on disk before the session ends.

A run keeps its results in memory and writes them back once, at the end of the session.  A
run that never gets there (the controller killed, a power cut) would lose every measurement, so
the controller also appends each result, as it arrives, to a journal beside the database::

    <database>/.perf-journal/<run id>.jsonl

The first line is a header naming the run (``{"perf_journal": 1, "database": ..., "update_mode":
..., "timestamp": ..., "started_at": ..., "command": [...], "backend": ...}``), each further line
one ``CaseResult.to_json()``.  A batch of results (one report's worth) is written with a single
``os.write`` on an ``O_APPEND`` descriptor and then ``fsync``'d: a signal never splits a line,
and what a batch brought survives a power cut once the batch is handled.

While its run is alive the journal's sidecar ``<run id>.lock`` is held (an OS lock, released
by the kernel when the process dies however it dies), so a session that finds the journal can
tell an abandoned run from one still running beside it.  Once write-back has put the results
in the CSVs the journal is deleted (the run's reports keep every result; a ``.done`` file per
run would only grow the directory).  A journal that is still there belongs to a run that never
finished writing: ``perf_plugin.run.recovery`` writes it back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock

from perf_plugin.results import CaseResult

JOURNAL_DIR_NAME = ".perf-journal"
JOURNAL_SUFFIX = ".jsonl"
LOCK_SUFFIX = ".lock"
FORMAT_VERSION = 1


def journal_dir(database: Path) -> Path:
    return database / JOURNAL_DIR_NAME


def lock_path_of(journal: Path) -> Path:
    return journal.with_suffix(LOCK_SUFFIX)


@dataclass(frozen=True)
class JournalHeader:
    """The run a journal belongs to: what write-back needs to write its results as that run would."""

    database: str
    update_mode: str
    timestamp: str  # the run's start, as write-back stamps the rows (``%Y%m%d_%H%M%S``, UTC)
    started_at: str  # ISO 8601, UTC
    command: list[str]
    backend: str

    def to_json(self) -> dict[str, Any]:
        return {
            "perf_journal": FORMAT_VERSION,
            "database": self.database,
            "update_mode": self.update_mode,
            "timestamp": self.timestamp,
            "started_at": self.started_at,
            "command": list(self.command),
            "backend": self.backend,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JournalHeader:
        if data.get("perf_journal") != FORMAT_VERSION:
            raise ValueError(f"not a version-{FORMAT_VERSION} run journal header")
        return cls(
            str(data["database"]),
            str(data["update_mode"]),
            str(data["timestamp"]),
            str(data.get("started_at", "")),
            [str(part) for part in data.get("command", [])],
            str(data.get("backend", "")),
        )


def _fsync_directory(directory: Path) -> None:
    """Make a new or removed directory entry durable (where the platform allows opening one)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class RunJournal:
    """The journal a running session appends to; created on its first batch of results."""

    def __init__(self, directory: Path, run_id: str, header: JournalHeader) -> None:
        self.path = directory / f"{run_id}{JOURNAL_SUFFIX}"
        self.header = header
        self.error: str | None = None  # why appending stopped (the disk filled up, ...)
        self._fd: int | None = None
        self._lock: filelock.BaseFileLock | None = None
        self._closed = False
        self.started = False  # the file exists (its first batch came)

    def append(self, results: Iterable[CaseResult]) -> None:
        """One batch: its lines in one write, then fsync.  A failure stops journaling (the
        results stay in memory for write-back) and is kept in ``error``, never raised into the
        hook that delivered the results."""
        batch = list(results)
        if not batch or self.error is not None or self._closed:
            return
        lines = [json.dumps(r.to_json(), separators=(",", ":")) for r in batch]
        try:
            if self._fd is None:
                self._open()
                lines.insert(0, json.dumps(self.header.to_json(), separators=(",", ":")))
            assert self._fd is not None
            data = ("\n".join(lines) + "\n").encode("utf-8")
            while data:  # a regular file takes it in one call, short of a full disk
                data = data[os.write(self._fd, data):]
            os.fsync(self._fd)
        except (OSError, filelock.Timeout) as exc:
            self.error = f"{self.path}: {exc}"

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # the liveness lock first: a journal file is never there without its run holding the lock
        lock = filelock.FileLock(str(lock_path_of(self.path)))
        lock.acquire(timeout=0)
        self._lock = lock
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666)
        self.started = True
        _fsync_directory(self.path.parent)

    def mark_done(self) -> None:
        """The results are in the CSVs: remove the journal, then its lock."""
        if self.started:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            _fsync_directory(self.path.parent)
        self.close(remove_lock=True)

    def close(self, remove_lock: bool = False) -> None:
        """Let go of the file and its lock (the journal stays unless ``mark_done`` removed it)."""
        if self._closed:
            return
        self._closed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
            if remove_lock:
                try:
                    lock_path_of(self.path).unlink()
                except FileNotFoundError:
                    pass


@dataclass
class JournalContents:
    path: Path
    header: JournalHeader | None
    results: list[CaseResult] = field(default_factory=list)  # in the order they arrived
    notes: list[str] = field(default_factory=list)  # lines that could not be read, and why


def read_journal(path: Path) -> JournalContents:
    """A journal's header and results.  A torn last line (the write a power cut interrupted)
    and any other line that is not a result are skipped with a note, never an error."""
    contents = JournalContents(path, None)
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty, unless the last write was torn
    if tail.strip():
        contents.notes.append(f"{path}: torn last line {len(lines) + 1} ignored ({len(tail)} bytes, no line end)")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
            if number == 1:
                contents.header = JournalHeader.from_json(value)
            else:
                contents.results.append(CaseResult.from_json(value))
        except (ValueError, KeyError, TypeError) as exc:
            what = "header" if number == 1 else "line"
            contents.notes.append(f"{path}: {what} {number} ignored: {type(exc).__name__}: {exc}")
    return contents


def pending_journals(database: Path) -> list[Path]:
    """Journals left in a database directory, oldest run first (run ids start with the time)."""
    directory = journal_dir(database)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.suffix == JOURNAL_SUFFIX and p.is_file())
