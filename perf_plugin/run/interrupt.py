"""SIGTERM ends a run the way Ctrl-C does, so what was measured is written back.

pytest turns SIGINT into ``KeyboardInterrupt``: the session stops, ``pytest_sessionfinish``
still runs (exit status ``INTERRUPTED``) and write-back writes what was measured.  SIGTERM (a
job scheduler's time limit, ``kill``, a container stopping) would end the process at once; here
it raises ``KeyboardInterrupt`` instead, once: a second SIGTERM ends the process as usual (the
run's journal keeps what the first shutdown had not written yet).

Installed only on the controller of a run of replay cases, only from the main thread and only
where nobody else handles SIGTERM; removed when the run ends.  An xdist worker takes
``worker_interrupts`` instead: its first SIGINT or SIGTERM stops it, the repeats of that one
interrupt do not (the controller's first interrupt is ``perf_plugin.run.xdist_stop``'s).

``signals_deferred`` holds SIGINT and SIGTERM back for a few statements that must not be cut in
two: the controller taking a batch of results into its journal and its memory, so that a result
the journal holds is one write-back writes (the journal is removed after write-back).

``one_interrupt_absorbed`` covers a session's end (the profiler's flush, the ranks' gather,
write-back): an interrupt rarely comes alone.  A terminal's Ctrl-C reaches every process of the
run and then torchrun's agent sends its ranks SIGTERM; xdist interrupts a worker that is still
busy five seconds after it was asked to stop, which may be in the middle of flushing what it
measured.  The first such signal there is absorbed with a line on stderr; the next one ends the
session at once, and the journals keep what was not written yet.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the next one ends the process
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def raises_interrupt(handler: Any) -> bool:
    """Whether ``handler`` is the one ``sigterm_as_interrupt`` installs."""
    return handler is _raise_interrupt


def sigterm_as_interrupt(config: pytest.Config) -> bool:
    """Install the handler for this run; False where it is not ours to install."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _raise_interrupt)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is _raise_interrupt:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    config.add_cleanup(restore)
    return True


def worker_interrupts(config: pytest.Config, *, sigterm: bool) -> bool:
    """Worker (xdist): the first SIGINT (and SIGTERM, where ``sigterm``) raises
    ``KeyboardInterrupt``; those after it are absorbed until the session end, whose flush
    ``one_interrupt_absorbed`` covers.  False where not ours to install.

    One interrupt reaches a worker more than once: a terminal's Ctrl-C reaches every process of
    the run, and the controller passes on the one it heard (``perf_plugin.run.xdist_stop``).  A
    second ``KeyboardInterrupt`` while the first unwinds the case would cut the session end,
    where the worker's profiler batch goes to its journal.  The controller's second interrupt
    still stops the run at once: xdist then kills its workers.

    A shell starts a background job (``pytest bench -n 2 &`` in a script, some CI runners) with
    SIGINT ignored, and its workers inherit that; heard here, since xdist stops a busy worker
    with SIGINT (a worker that ignored it died with its batch unflushed: SIGTERM to such a run,
    41 cases passed, none written back)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    numbers = [signal.SIGINT] if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, signal.SIG_IGN) else []
    if sigterm and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        numbers.append(signal.SIGTERM)
    heard: list[int] = []

    def interrupt_once(signum: int, frame: FrameType | None) -> None:
        if not heard:
            heard.append(signum)
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = {number: signal.signal(number, interrupt_once) for number in numbers}

    def restore() -> None:
        for number, handler in previous.items():
            if signal.getsignal(number) is interrupt_once:
                signal.signal(number, handler)

    config.add_cleanup(restore)
    return bool(numbers)


_DEFERRED = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _signals_handled_by(handler: Callable[[int, FrameType | None], None]) -> Iterator[dict[int, Any]]:
    """SIGINT and SIGTERM go to ``handler`` inside the block (the main thread's only: Python runs
    handlers there); yields the handlers they had, which come back when it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    previous: dict[int, Any] = {number: signal.signal(number, handler) for number in _DEFERRED}
    try:
        yield previous
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive inside the block are handled when it ends.

    Blocking them with ``pthread_sigmask`` would not do: torch's threads leave them unblocked,
    and Python runs its handler in the main thread whichever thread the kernel picked.  The
    handlers are swapped for one that notes the signal instead (a few microseconds).
    """
    caught: list[int] = []
    previous: dict[int, Any] = {}
    try:
        with _signals_handled_by(lambda signum, frame: caught.append(signum)) as previous:
            yield
    finally:
        for signum in caught:
            handler = previous[signal.Signals(signum)]
            if callable(handler):
                handler(signum, None)  # Python's SIGINT handler raises KeyboardInterrupt, as ours does
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


@contextmanager
def one_interrupt_absorbed() -> Iterator[None]:
    """SIGINT or SIGTERM inside the block: the first is absorbed (a line says so), the next raises
    ``KeyboardInterrupt`` as usual."""
    absorbed: list[int] = []

    def absorb(signum: int, frame: FrameType | None) -> None:
        if absorbed:
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")
        absorbed.append(signum)
        sys.stderr.write(
            f"\nperf: {signal.Signals(signum).name} while the run writes back what it measured: finishing; "
            "interrupt again to stop now (the run's journal keeps what is not written yet)\n"
        )

    with _signals_handled_by(absorb):
        yield
