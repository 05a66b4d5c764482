"""Runs of replay cases only skip pytest's per-test log capture unless logging was asked for.

pytest's ``logging`` plugin attaches its two capture handlers, in every phase of every test, to
the root logger and to every logger that does not propagate; torch registers about forty such
loggers, so on a 2-core x86 host the capture costs ~0.35 ms per test: more than a third of what
a small CPU replay case costs in all (``benchmarks/bench_overhead.py``).  Replays do not log, and
what a library logs at WARNING or above during a replay still reaches the test's captured stderr
(torch's own handler, or Python's last-resort handler), which pytest shows with a failure.

So when every selected test is a replay case, no ``--log-*`` option or ini key asks for logging,
and ``--perf-replay-log-capture`` is ``auto``, the plugin unregisters pytest's logging plugin after
collection (before any test runs); a run with any other test in it keeps it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

LOGGING_PLUGIN = "logging-plugin"  # the name pytest registers its LoggingPlugin under
# pytest's own logging settings (option dests, which are also ini names) that ask for logging
LOGGING_SETTINGS = ("log_level", "log_cli_level", "log_file", "log_file_level")


def _setting(config: pytest.Config, name: str) -> object:
    """A pytest setting from its option, else its ini key; None where pytest does not know it."""
    for read in (config.getoption, config.getini):
        try:
            value = read(name)
        except ValueError:  # -p no:logging: the settings are not registered
            continue
        if value not in (None, "", []):
            return value
    return None


def logging_requested(config: pytest.Config) -> str | None:
    """The first pytest logging setting the user gave (option or ini), or None."""
    for name in (*LOGGING_SETTINGS, "log_cli"):
        if _setting(config, name):
            return name
    return None


def skip_log_capture(
    config: pytest.Config, items: Sequence[pytest.Item], is_replay: Callable[[pytest.Item], bool], mode: str
) -> bool:
    """Unregister pytest's logging plugin for a run of replay cases only; True if it was."""
    if mode != "auto" or not items or not all(is_replay(item) for item in items):
        return False
    if logging_requested(config) is not None:
        return False
    plugin = config.pluginmanager.get_plugin(LOGGING_PLUGIN)
    if plugin is None:
        return False  # -p no:logging, or another plugin removed it
    config.pluginmanager.unregister(plugin)
    # what its pytest_unconfigure would have done (it no longer receives hooks)
    unconfigure = getattr(plugin, "pytest_unconfigure", None)
    if callable(unconfigure):
        unconfigure()
    return True
