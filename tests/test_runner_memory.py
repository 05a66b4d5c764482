"""The free-memory check before a case: clear skip for rows too large, few device queries."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from perf_plugin.run.runner import MEMORY_HEADROOM, CaseSkip, ReplayRunner


class CountingBackend:
    name = "cuda"

    def __init__(self, free: int) -> None:
        self.free = free
        self.queries = 0

    def free_memory_bytes(self) -> int:
        self.queries += 1
        return self.free


def _case(nbytes: int) -> SimpleNamespace:
    return SimpleNamespace(row=SimpleNamespace(nbytes=nbytes), ref=SimpleNamespace(csv_file="Add.csv", row_line=7))


def _runner(backend: CountingBackend) -> ReplayRunner:
    return ReplayRunner(backend, collector=None, repeat_count=1, warmup_count=0)  # type: ignore[arg-type]


def test_small_cases_after_the_first_query_do_not_query_again() -> None:
    backend = CountingBackend(free=80 * 2**30)
    runner = _runner(backend)
    for _ in range(100):
        runner._check_memory(_case(1 << 20))  # type: ignore[arg-type]
    assert backend.queries == 1


def test_a_large_case_queries_and_is_skipped_with_file_row_and_column() -> None:
    backend = CountingBackend(free=80 * 2**30)
    runner = _runner(backend)
    runner._check_memory(_case(1 << 20))  # type: ignore[arg-type]
    backend.free = 2**30  # another process took the memory meanwhile
    with pytest.raises(CaseSkip, match=r"Add\.csv, row 7, column 'Input Shapes': tensors need about"):
        runner._check_memory(_case(int(8 * 2**30 / MEMORY_HEADROOM)))  # type: ignore[arg-type]
    assert backend.queries == 2


def test_after_memory_shrinks_small_cases_are_checked_against_the_new_figure() -> None:
    backend = CountingBackend(free=2**30)
    runner = _runner(backend)
    runner._check_memory(_case(1 << 20))  # type: ignore[arg-type]  # 3 MiB of 1 GiB: below the share
    backend.free = 2 << 20
    with pytest.raises(CaseSkip):  # 90 MiB: above the share of 1 GiB, so queried, and too large
        runner._check_memory(_case(30 << 20))  # type: ignore[arg-type]
    with pytest.raises(CaseSkip):  # 3 MiB: above the share of the 2 MiB now seen, queried again
        runner._check_memory(_case(1 << 20))  # type: ignore[arg-type]
    assert backend.queries == 3
