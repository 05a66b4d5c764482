"""Runs of replay cases only skip pytest's per-test log capture, unless logging was asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_plugin import ADD_ROWS, BENCH_TEST, HEADER, _profiler_modules_loaded, run, write_csv  # noqa: F401

# Records whether pytest's logging plugin was registered when the tests ran.
PROBE_CONFTEST = """
from pathlib import Path

def pytest_runtestloop(session):
    registered = session.config.pluginmanager.has_plugin("logging-plugin")
    Path("logging_plugin.txt").write_text(str(registered))
"""

LOGGING_REPLAY = """
import logging

def test_kernel_replay(kernel_case, perf_runner):
    logging.getLogger("torch.fx.experimental.symbolic_shapes").warning("warned-during-%s", "replay")
    perf_runner.replay(kernel_case)
    assert False, "made to fail"
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> Path:
    pytester.makeconftest(PROBE_CONFTEST)
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = pytester.path / "db"
    write_csv(db / "Add.csv", HEADER, ADD_ROWS)
    return db


def logging_plugin_was_registered(pytester: pytest.Pytester) -> bool:
    return {"True": True, "False": False}[(pytester.path / "logging_plugin.txt").read_text()]


def test_replay_only_run_skips_log_capture_and_says_so(pytester: pytest.Pytester, project: Path) -> None:
    result = run(pytester, project)
    result.assert_outcomes(passed=1)
    assert not logging_plugin_was_registered(pytester)
    result.stdout.fnmatch_lines(["*per-test log capture was off (replay cases only; --perf-replay-log-capture on keeps it)*"])


@pytest.mark.parametrize(
    "args",
    [
        ("--replay-log-capture", "on"),
        ("--log-level", "INFO"),
        ("--log-cli-level", "WARNING"),
        ("-o", "log_cli=true"),
        ("--log-file", "run.log"),
    ],
)
def test_capture_is_kept_when_asked_for(pytester: pytest.Pytester, project: Path, args: tuple[str, ...]) -> None:
    result = run(pytester, project, *args)
    result.assert_outcomes(passed=1)
    assert logging_plugin_was_registered(pytester)
    assert "per-test log capture was off" not in result.stdout.str()


def test_a_run_with_other_tests_keeps_capture(pytester: pytest.Pytester, project: Path) -> None:
    pytester.makepyfile(test_other="def test_plain():\n    assert True\n")
    result = run(pytester, project)
    result.assert_outcomes(passed=2)
    assert logging_plugin_was_registered(pytester)


def test_collect_only_leaves_logging_alone(pytester: pytest.Pytester, project: Path) -> None:
    result = run(pytester, project, "--collect-only", "-q")
    assert result.ret == 0
    assert "per-test log capture was off" not in result.stdout.str()


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_failing_replays_warning_is_shown_either_way(pytester: pytest.Pytester, project: Path, mode: str) -> None:
    pytester.makepyfile(test_kernels=LOGGING_REPLAY)
    result = run(pytester, project, "--replay-log-capture", mode)
    result.assert_outcomes(failed=1)
    assert logging_plugin_was_registered(pytester) is (mode == "on")
    result.stdout.fnmatch_lines(["*made to fail*"])
    assert "warned-during-replay" in result.stdout.str()
    assert "Toggling CPU activity" not in result.stdout.str()  # the profiler's own chatter stays out
