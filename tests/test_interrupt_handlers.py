"""The signal handlers an interrupted run goes through, in this process with real signals.

The runs they serve (``pytest bench -n 2`` stopped by Ctrl-C or SIGTERM, a worker inside a long
kernel) are in ``tests/test_journal.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from perf_plugin.run.interrupt import sigterm_as_interrupt, worker_interrupts
from perf_plugin.run.xdist_stop import stop_after_current_cases, worker_pids


class _Config:
    """What the handlers use of a pytest config: its cleanups and its plugins."""

    def __init__(self, plugins: dict[str, object] | None = None) -> None:
        self.cleanups: list = []
        self.pluginmanager = SimpleNamespace(getplugin=(plugins or {}).get)

    def add_cleanup(self, function) -> None:  # type: ignore[no-untyped-def]
        self.cleanups.append(function)

    def cleanup(self) -> None:
        while self.cleanups:
            self.cleanups.pop()()


@pytest.fixture
def handlers_kept() -> Iterator[None]:
    saved = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


def _signal_self(number: int) -> None:
    os.kill(os.getpid(), number)
    time.sleep(0.05)  # Python runs the handler at the next instruction; the sleep gives it one


def test_a_worker_stops_once_however_often_the_interrupt_arrives(handlers_kept: None) -> None:
    config = _Config()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's worker: SIGINT heard all the same
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert worker_interrupts(config, sigterm=True)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        _signal_self(signal.SIGTERM)
    _signal_self(signal.SIGINT)  # the controller passing it on: absorbed
    _signal_self(signal.SIGTERM)
    config.cleanup()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_worker_leaves_a_handler_it_did_not_expect_alone(handlers_kept: None) -> None:
    def theirs(signum, frame) -> None:  # type: ignore[no-untyped-def]
        pass

    signal.signal(signal.SIGINT, theirs)
    signal.signal(signal.SIGTERM, theirs)
    assert not worker_interrupts(_Config(), sigterm=True)  # type: ignore[arg-type]
    assert signal.getsignal(signal.SIGINT) is theirs and signal.getsignal(signal.SIGTERM) is theirs


@pytest.fixture
def sleeping_worker() -> Iterator[subprocess.Popen[bytes]]:
    """A process that exits 7 on SIGINT, standing in for a worker ending its case."""
    code = "import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: sys.exit(7)); print(flush=True); time.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.readline()  # its handler is in place
    yield process
    process.kill()
    process.wait()


def _dsession(process: subprocess.Popen[bytes]) -> SimpleNamespace:
    """xdist's DSession as far as the stop reads it: its node manager's group of execnet gateways."""
    gateway = SimpleNamespace(_io=SimpleNamespace(popen=process))
    return SimpleNamespace(shouldstop=False, nodemanager=SimpleNamespace(group=[gateway]))


def test_the_controller_s_first_interrupt_stops_scheduling_and_tells_the_workers(
    handlers_kept: None, sleeping_worker: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    dsession = _dsession(sleeping_worker)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    config = _Config({"dsession": dsession})
    sigterm_as_interrupt(config)  # type: ignore[arg-type]
    with stop_after_current_cases(config):  # type: ignore[arg-type]
        _signal_self(signal.SIGTERM)  # a `kill` of the controller alone
        assert dsession.shouldstop == "interrupted (SIGTERM)"
        assert sleeping_worker.wait(timeout=10) == 7  # the worker heard SIGINT
        assert worker_pids(dsession) == []  # it has ended
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            _signal_self(signal.SIGINT)  # the second stops now
    assert "SIGTERM: stopping; each worker ends the case it is in" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    config.cleanup()


def test_without_xdist_the_controller_s_interrupt_is_pytest_s(handlers_kept: None) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with stop_after_current_cases(_Config()):  # type: ignore[arg-type]
        with pytest.raises(KeyboardInterrupt):
            _signal_self(signal.SIGINT)
