"""An interrupted xdist run ends after each worker's current case, so nothing measured is lost.

Interrupted, pytest-xdist's controller tears its workers down at once: execnet asks each worker to
stop, interrupts one still busy five seconds later, and the controller kills one still up ten
seconds after asking.  A worker inside one long kernel (a CPU's bf16 GEMM under load takes tens of
seconds) hears nothing until the kernel returns, and died with the cases it had measured since
its last profiler batch (``pytest bench -n 2`` on the shipped CPU database, Ctrl-C 45 s in: 34
cases passed, 16 written back).

Here the controller's first SIGINT or SIGTERM stops the scheduling instead and passes the
interrupt on to each worker, since a ``kill`` of the controller alone (``timeout``, a container's
stop) reaches none of them: each worker ends the case it is in, flushes what it measured into its
journal and ends its session; xdist then ends the run interrupted, and write-back writes it all.
A second interrupt stops at once, as xdist did at the first; the journals keep what was flushed.
A background job's run, whose controller ignores SIGINT and whose workers hear it, always ended
this way.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest

from perf_plugin.run.interrupt import raises_interrupt

_HANDLED = (signal.SIGINT, signal.SIGTERM)


def worker_pids(dsession: Any) -> list[int]:
    """The local worker processes still running: execnet's popen gateways, which ``-n`` starts
    (a remote worker's process is not this machine's to signal)."""
    group = getattr(getattr(dsession, "nodemanager", None), "group", None)
    pids: list[int] = []
    for gateway in list(group or ()):
        process = getattr(getattr(gateway, "_io", None), "popen", None)
        if process is not None and process.returncode is None and isinstance(process.pid, int):
            pids.append(process.pid)
    return pids


def _ours_to_take(number: int) -> bool:
    """Python's default for SIGINT, pytest's default or this plugin's for SIGTERM; a handler
    someone else installed (or SIGINT ignored, as a background job starts) is left alone."""
    handler = signal.getsignal(number)
    if number == signal.SIGINT:
        return handler is signal.default_int_handler
    return handler is signal.SIG_DFL or raises_interrupt(handler)


def _announce(name: str) -> None:
    sys.stderr.write(
        f"\nperf: {name}: stopping; each worker ends the case it is in and keeps what it measured; "
        "interrupt again to stop now (the run's journal keeps what the workers flushed)\n"
    )


@contextmanager
def stop_after_current_cases(config: pytest.Config) -> Iterator[None]:
    """Controller of an xdist run, around its loop: the first interrupt stops the run after each
    worker's case, the second raises ``KeyboardInterrupt`` as usual."""
    dsession = config.pluginmanager.getplugin("dsession")
    numbers = [n for n in _HANDLED if _ours_to_take(n)]
    if dsession is None or not numbers or threading.current_thread() is not threading.main_thread():
        yield
        return
    heard: list[int] = []
    previous: dict[int, Any] = {}

    def restore() -> None:
        for number, handler in previous.items():
            signal.signal(number, handler)
        previous.clear()

    def stop(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if heard:
            restore()
            raise KeyboardInterrupt(f"signal {name}")
        heard.append(signum)
        _announce(name)
        dsession.shouldstop = f"interrupted ({name})"  # no case is scheduled from here on
        for pid in worker_pids(dsession):
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:  # it ended meanwhile
                pass

    previous.update({number: signal.signal(number, stop) for number in numbers})
    try:
        yield
    finally:
        restore()
