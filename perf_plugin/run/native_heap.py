"""The C heap of a long replay run: freed tensor memory goes back to the system.

CPU tensors live in the C library's heap.  glibc serves a block of at least its mmap threshold
with a mapping of its own, returned when freed, but after such a free it raises the threshold to
the freed size (up to 32 MiB on 64-bit): a run whose rows grow then allocates its tensors from
the heap, where freed blocks stay resident until the top of the heap is free.  A run of 100,000
small rows grew to ~2 GB that way.  ``malloc_trim`` hands the free pages of every arena back
(``madvise(MADV_DONTNEED)`` on free blocks, not only the top); it walks the arenas, so the runner
calls it every ``TRIM_EVERY_CASES`` cases rather than after each.  Elsewhere (musl, macOS,
Windows) there is nothing to call and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
from collections.abc import Callable

TRIM_EVERY_CASES = 64


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    function = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if function is None:
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


def trim_native_heap() -> bool:
    """Return the C heap's free pages to the system; False where the C library has no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
