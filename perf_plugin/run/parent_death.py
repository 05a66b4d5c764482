"""Processes that must not outlive their parent: torchrun's ranks, and the agent the plugin starts.

``kill -9`` of a torchrun agent (or of the pytest that started one with ``--comm-nproc``) used to
leave its ranks running: they kept the rendezvous port, and the next run on that port hung on
them.  Linux delivers ``PR_SET_PDEATHSIG``'s signal to a process when the thread that started it
exits, however it exits; SIGTERM then ends a rank the way a scheduler's stop does (a replay rank
writes back what it measured first, ``perf_plugin.run.interrupt``).  Elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Ask the kernel for ``signum`` when the parent goes; False where that cannot be asked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
