"""Result journals carried between hosts: a shard's results exported, then merged into one database.

A scheduler that starts one pytest per host (``--perf-shard I/N``) without a file system the
hosts share leaves each shard's durations in that host's copy of the database.  With
``--perf-results-out FILE`` a run also writes what it measured to FILE, in the run journal's
format (a header naming the run, then one result a line); ``perfdb merge DATABASE FILE ...``
writes each such file into DATABASE as its run would have written it (its update mode, its start
time in the timestamp column), leaving the files as they are.  Merging a file twice writes the
same cells again.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perf_plugin.database.atomic import atomic_write_text
from perf_plugin.results import CaseResult, FileWriteback
from perf_plugin.run.journal import JournalHeader, read_journal
from perf_plugin.run.recovery import kept_results, run_header
from perf_plugin.run.state import RunState
from perf_plugin.run.writeback import WritebackRequest, write_back
from perf_plugin.usage import UsageError


def export_results(path: Path, header: JournalHeader, results: Iterable[CaseResult]) -> int:
    """Write the run's results with a duration to ``path`` (atomically); how many."""
    kept = kept_results(list(results))
    lines = [json.dumps(header.to_json(), separators=(",", ":"))]
    lines += [json.dumps(result.to_json(), separators=(",", ":")) for result in kept]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return len(kept)


@dataclass
class Merged:
    path: Path
    results: int = 0
    files: list[FileWriteback] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def describe(self, dry_run: bool) -> str:
        if dry_run:
            return f"{self.path}: {self.results} measured case(s) (dry run: nothing written)"
        written = sum(f.rows_updated + f.rows_appended for f in self.files)
        return f"{self.path}: {self.results} measured case(s), {written} row(s) written in {len(self.files)} file(s)"


def merge_results(database: Path, paths: Sequence[Path], *, lock_timeout: float = 60.0, dry_run: bool = False) -> list[Merged]:
    """Write each result file into ``database``, in the order given (a later file's values win)."""
    if not database.is_dir():
        raise UsageError(f"{database}: no such database directory")
    merged = []
    for path in paths:
        try:
            contents = read_journal(path)
        except OSError as exc:
            raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
        if contents.header is None:
            raise UsageError(f"{path}: not a result journal (its first line is no journal header)")
        item = Merged(path, notes=contents.notes)
        results = kept_results(contents.results)
        item.results = len(results)
        if results and not dry_run:
            request = WritebackRequest(database, contents.header.update_mode, False, contents.header.timestamp, lock_timeout)
            item.files, _ = write_back(request, results, [])
        merged.append(item)
    return merged


def export_run(state: RunState, results: Iterable[CaseResult], timestamp: str) -> list[str]:
    """``--perf-results-out``: the run's results to its file; the terminal line saying so."""
    path = state.settings.results_out
    if path is None:
        return []
    try:
        count = export_results(path, run_header(state, list(sys.argv), timestamp), results)
    except OSError as exc:
        return [f"results not written to {path}: {exc}"]
    return [f"results: {count} measured case(s) in {path} (perfdb merge DATABASE {path} writes them into a database)"]
