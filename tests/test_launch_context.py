"""Launch context at ingest: ``Launched Idle``, the share of a row's launches that found the device idle.

A PyTorch trace says, for every kernel, when the host began its launch and when the device ran
it; a launch that began after every earlier device activity had ended found the device idle.
The real H100 trace in ``tests/fixtures/cuda/rope_cat_trace.json`` (see its SOURCES.md) is read
here with the json module as an independent check of what ingest writes.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from perf_plugin.database.schema import LAUNCHED_IDLE, profiling_counter_column
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.ingest.trace_attribution import idle_launches
from perf_plugin.trace.events import DeviceActivity, Launch

TRACE = Path(__file__).parent / "fixtures" / "cuda" / "rope_cat_trace.json"
COLUMN = profiling_counter_column(LAUNCHED_IDLE)


def _activity(start: int, duration: int, correlation: int | None) -> DeviceActivity:
    return DeviceActivity("k", "kernel", start, duration, correlation, None)


def _launch(start: int, correlation: int) -> Launch:
    return Launch("cudaLaunchKernel", (1, 1), start, correlation, None)


def test_a_launch_after_every_earlier_activity_ended_found_the_device_idle() -> None:
    activities = [
        _activity(100, 50, 1),  # launched at 90 onto an empty device
        _activity(150, 10, 2),  # launched at 120, while the first ran until 150: queued
        _activity(400, 10, 3),  # launched at 200, after everything ended at 160: idle
        _activity(405, 100, None),  # no launch recorded: no verdict
        _activity(510, 5, 4),  # launched at 450, the activity without a launch ran until 505: queued
    ]
    launches = {c: _launch(t, c) for c, t in ((1, 90), (2, 120), (3, 200), (4, 450))}
    assert idle_launches(activities, launches) == {0: True, 1: False, 2: True, 4: False}


def test_activities_are_taken_in_device_order_not_file_order() -> None:
    activities = [_activity(300, 10, 2), _activity(100, 250, 1)]  # the second ran first, until 350
    launches = {1: _launch(50, 1), 2: _launch(200, 2)}
    assert idle_launches(activities, launches) == {1: True, 0: False}


def _expected_shares_from_the_raw_trace() -> list[float]:
    """Per top-level operator sample with kernels: 1.0/0.0 from the raw events, by the rule."""
    events = json.loads(TRACE.read_text())["traceEvents"]
    device = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    launch_at = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    idle, busy_until = {}, float("-inf")
    for event in device:
        correlation = event["args"].get("correlation")
        if correlation in launch_at:
            idle[correlation] = launch_at[correlation] >= busy_until
        busy_until = max(busy_until, event["ts"] + event["dur"])
    return [1.0 if flag else 0.0 for flag in idle.values()]


def test_ingest_of_a_real_trace_writes_the_share_of_idle_launches_per_row(tmp_path: Path) -> None:
    ingest_path(TRACE, tmp_path / "db")
    shares, counts = [], []
    for path in sorted((tmp_path / "db").glob("*.csv")):
        with path.open(newline="") as handle:
            for cells in csv.DictReader(handle):
                assert COLUMN in cells, f"{path.name} has no {COLUMN!r} column"
                shares.append(float(cells[COLUMN]))
                counts.append(int(cells["Profiling Count"]))
    assert shares and all(0.0 <= share <= 1.0 for share in shares)
    # every row's share is a mean of 0/1 flags over its launches (an operator's first kernel);
    # this script launched each kernel after the previous one had ended (a cuBLAS kernel through
    # the driver API among them), so a reading of the raw events finds every kernel idle
    raw = _expected_shares_from_the_raw_trace()
    assert len(raw) == 14 and sum(raw) == 14
    assert sum(share * count for share, count in zip(shares, counts)) == pytest.approx(sum(counts))
    assert all(share == 1.0 for share in shares)
