"""Counts of the run's own on pytest's last line ("78 passed, 64 written, 14 left in 30.1s").

pytest builds its closing line from ``TerminalReporter.stats``: one "N key" part for every key
that holds entries, pytest's own outcomes first, then any key a plugin added (as
pytest-rerunfailures adds "rerun").  A user who reads only the last line (a CI log, a scheduler's
mail) then sees what the run wrote back, or that a coverage gate failed, beside what passed.
"""

from __future__ import annotations

import pytest


class SummaryEntry:
    """One counted thing on the closing line; pytest counts entries, it reads nothing else."""

    count_towards_summary = True

    def __init__(self, label: str) -> None:
        self.label = label

    def __repr__(self) -> str:
        return f"SummaryEntry({self.label!r})"


def count_on_last_line(config: pytest.Config, label: str, count: int) -> None:
    """Show "<count> <label>" on pytest's closing line (nothing when count is 0 or no terminal)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or count <= 0:
        return
    entries = [SummaryEntry(label) for _ in range(count)]
    add = getattr(reporter, "_add_stats", None)
    if callable(add):
        # pytest decides once which keys the line shows, and again only when a new key arrives
        # through this method (or after the last test, which an interrupted run never reaches)
        add(label, entries)
    else:
        reporter.stats.setdefault(label, []).extend(entries)
