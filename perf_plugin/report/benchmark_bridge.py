"""The replays' device timings as pytest-benchmark's benchmarks, so that its storage and comparison
(``--benchmark-autosave``, ``--benchmark-json``, ``--benchmark-compare``,
``--benchmark-compare-fail``, ``pytest-benchmark compare``) work on them unchanged.

Every measured case becomes one of pytest-benchmark's ``Metadata`` entries whose ``Stats`` hold
the case's timed repeats, in seconds, as the profiler measured them on the device: nothing here
times anything, and pytest-benchmark's own timer never runs for a replay.  The entry is named as
pytest-benchmark names a test (``name`` the test's name, ``fullname`` its node id, which is what
comparisons match on), grouped by kernel type, and its ``extra_info`` says which database row
it measured and on what.  One entry is one row of pytest-benchmark's tables, with
``iterations`` 1 (each sample is one call) and ``rounds`` the number of timed repeats.

The entries are given to pytest-benchmark's session only when a run asks it for something
(saving, JSON, a comparison, a histogram, or ``--benchmark-enable``), so a plain ``pytest bench``
does not print a table of thousands of rows; ``--benchmark-disable`` keeps them out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from perf_plugin.results import OUTCOME_PASSED, CaseRef, CaseResult

# pytest-benchmark's options (their ``dest``) that ask it for something a replay run can give
_REQUESTING_OPTIONS = (
    "benchmark_save",
    "benchmark_autosave",
    "benchmark_json",
    "benchmark_compare",
    "benchmark_compare_fail",
    "benchmark_histogram",
    "benchmark_enable",
)


@dataclass(frozen=True)
class BenchmarkIdentity:
    """What pytest-benchmark's ``Metadata`` reads from the fixture that made it.

    Its own fixture times the test's code; this stands in for it where the samples came from the
    device profiler, carrying the same fields (``cprofile_stats`` and ``has_error`` as a fixture
    that ran without ``--benchmark-cprofile`` and without an error has them).
    """

    name: str
    fullname: str
    group: str
    param: str
    params: dict[str, str]
    extra_info: dict[str, Any] = field(default_factory=dict)
    cprofile_stats: None = None
    has_error: bool = False


def benchmark_session(config: pytest.Config) -> Any | None:
    """pytest-benchmark's ``BenchmarkSession`` of this run, or None when the plugin is not active."""
    return getattr(config, "_benchmarksession", None)


def requested(config: pytest.Config) -> bool:
    """Whether the run asked pytest-benchmark for something (and did not disable it)."""
    if config.getoption("benchmark_disable", False) and not config.getoption("benchmark_enable", False):
        return False
    return any(config.getoption(name, None) for name in _REQUESTING_OPTIONS)


def node_ids_by_case(refs_by_node: Mapping[str, CaseRef]) -> dict[str, str]:
    """The test node id of each case id (the controller keeps its records by node id)."""
    return {ref.case_id: node_id for node_id, ref in refs_by_node.items()}


def measured(results: Iterable[CaseResult], node_ids: Mapping[str, str]) -> list[tuple[str, CaseResult]]:
    """The passed cases with device samples, each with its node id, in node-id order.

    A measurement no selected test made (on an NPU, an msprof row that matched no case) has no
    node id to be compared by and is left out, as are failed and unmeasured cases.
    """
    found = [
        (node_ids[r.ref.case_id], r)
        for r in results
        if r.outcome == OUTCOME_PASSED and r.has_duration and r.ref.case_id in node_ids
    ]
    return sorted(found, key=lambda pair: pair[0])


def identity_of(node_id: str, result: CaseResult, device_name: str) -> BenchmarkIdentity:
    """The benchmark's names, group and extra information for one measured case."""
    ref = result.ref
    extra: dict[str, Any] = {
        "kernel_type": ref.kernel_type,
        "csv_file": ref.csv_file,
        "row_line": ref.row_line,
        "signature": ref.signature_key,
        "backend": result.backend,
        "device": device_name,
        "samples": "device time of each timed repeat, seconds",
    }
    if result.reported_kernel_type:
        extra["reported_kernel_type"] = result.reported_kernel_type
    return BenchmarkIdentity(
        name=node_id.rpartition("::")[2],
        fullname=node_id,
        group=ref.kernel_type,
        param=ref.case_id,
        params={"kernel_case": ref.case_id},
        extra_info=extra,
    )


def to_metadata(identity: BenchmarkIdentity, samples_us: Iterable[float], options: Mapping[str, Any]) -> Any:
    """One pytest-benchmark ``Metadata`` whose stats are the given samples, converted to seconds."""
    from pytest_benchmark.stats import Metadata

    entry = Metadata(identity, 1, dict(options))  # type: ignore[no-untyped-call]
    entry.stats.data.extend(sample * 1e-6 for sample in samples_us)  # what Metadata.update does, at 1 iteration
    return entry


def timing_options(backend: str, repeat_count: int, warmup_count: int, cache_mode: str) -> dict[str, Any]:
    """The ``options`` a stored benchmark records: how its samples were taken, in
    pytest-benchmark's keys where one means the same (``min_rounds``, ``warmup``,
    ``warmup_iterations``) and the harness's own where none does."""
    return {
        "timer": f"perf_plugin.device:{backend}",
        "min_rounds": repeat_count,
        "warmup": warmup_count > 0,
        "warmup_iterations": warmup_count,
        "cache_mode": cache_mode,
    }


def add_benchmarks(
    session: Any,
    results: Iterable[CaseResult],
    refs_by_node: Mapping[str, CaseRef],
    *,
    device_name: str,
    options: Mapping[str, Any],
) -> int:
    """Append an entry for each measured case to pytest-benchmark's session; how many were added.

    A node id the session already holds is not added twice.
    """
    present = {entry.fullname for entry in session.benchmarks}
    added = 0
    for node_id, result in measured(results, node_ids_by_case(refs_by_node)):
        if node_id in present:
            continue
        identity = identity_of(node_id, result, device_name)
        session.benchmarks.append(to_metadata(identity, result.samples_us, options))
        added += 1
    return added
