"""The cyclic garbage collector during a replay run: the long-lived heap is frozen.

A replay run's heap is mostly torch, pytest and plugins: a few hundred thousand long-lived
objects that each full collection walks again (~0.1 s each), and pytest allocates enough per
test (items, reports) to trigger one every few hundred cases.
"""

from __future__ import annotations

import gc

import pytest

HEAP_FROZEN = pytest.StashKey[bool]()


def freeze_heap(config: pytest.Config) -> None:
    """Exempt every object alive now from the cyclic garbage collector (``gc.freeze``).

    A replay run's heap is mostly torch, pytest and plugins: a few hundred thousand long-lived
    objects that each full collection walks again (~0.1 s each), and pytest allocates enough
    per test (items, reports) to trigger one every few hundred cases.  Frozen objects are still
    freed by reference counting; cyclic garbage among them waits until the heap is thawed at
    the end of the run.  Called at collection, at the start of the loop and after the first
    replay (which imports the rest of torch on the first profiler start).
    """
    gc.freeze()
    config.stash[HEAP_FROZEN] = True


def thaw_heap(config: pytest.Config) -> None:
    if config.stash.get(HEAP_FROZEN, False):
        gc.unfreeze()
        config.stash[HEAP_FROZEN] = False
