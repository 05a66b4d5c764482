"""Freed host tensors go back to the system during a long run (glibc's heap keeps them otherwise)."""

from __future__ import annotations

import os
import platform

import pytest
import torch

from perf_plugin.backends.cpu import CpuBackend
from perf_plugin.run import native_heap
from perf_plugin.run.native_heap import TRIM_EVERY_CASES, trim_native_heap
from perf_plugin.run.runner import ReplayRunner

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def resident_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc_trim")
def test_trimming_returns_the_pages_of_freed_tensors_that_the_heap_kept() -> None:
    # After freeing a mapping of 8 MB glibc raises its mmap threshold to that size, so the 1 MB
    # tensors below come from the heap; the small tensor after each keeps its top from shrinking.
    large = torch.ones(8 * 2**20, dtype=torch.uint8)
    del large
    blocks, pins = [], []
    for _ in range(200):
        blocks.append(torch.ones(2**20, dtype=torch.uint8))
        pins.append(torch.ones(64, dtype=torch.uint8))
    del blocks
    kept = resident_bytes()
    assert trim_native_heap()
    assert kept - resident_bytes() > 100 * 2**20  # of the 200 MB freed
    del pins


def test_the_runner_trims_every_so_many_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr("perf_plugin.run.runner.trim_native_heap", lambda: calls.append(1) or True)
    runner = ReplayRunner(CpuBackend(), collector=None, repeat_count=1, warmup_count=0)  # type: ignore[arg-type]
    for _ in range(2 * TRIM_EVERY_CASES + 1):
        runner._release(1024)
    assert len(calls) == 2


def test_without_glibc_nothing_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    native_heap._malloc_trim.cache_clear()
    monkeypatch.setattr(native_heap.platform, "libc_ver", lambda: ("", ""))
    try:
        assert trim_native_heap() is False
    finally:
        native_heap._malloc_trim.cache_clear()
