"""An xdist worker's set-up: its own device, and its share of the host's cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perf_plugin.run.setup import THREAD_VARIABLES, DeviceIdentity, pin_worker_device, share_host_threads

from tests.test_plugin import ADD_ROWS, BENCH_TEST, HEADER, write_csv


def test_each_worker_gets_its_share_of_the_cores() -> None:
    environ: dict[str, str] = {}
    threads = share_host_threads({"workercount": 2}, environ)
    assert threads == max(1, (os.cpu_count() or 1) // 2)
    assert {name: environ[name] for name in THREAD_VARIABLES} == dict.fromkeys(THREAD_VARIABLES, str(threads))


def test_a_thread_count_the_user_set_is_kept_and_one_worker_keeps_every_core() -> None:
    environ = {"OMP_NUM_THREADS": "3"}
    assert share_host_threads({"workercount": 4}, environ) is None
    assert environ == {"OMP_NUM_THREADS": "3"}
    environ = {}
    assert share_host_threads({"workercount": 1}, environ) is None and environ == {}


def test_a_worker_is_pinned_to_its_own_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    pin_worker_device(DeviceIdentity("cuda", "NVIDIA_H100", None), {"workerid": "gw1", "workercount": 2, "perf_device_count": 2})
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    assert os.environ["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))


# Runs in the workers beside the replay cases: what a worker's torch was given.
THREADS_TEST = """
import os, torch

def test_worker_threads():
    expected = max(1, (os.cpu_count() or 1) // 2)
    assert os.environ["OMP_NUM_THREADS"] == str(expected)
    assert torch.get_num_threads() == expected
"""


def test_workers_of_a_run_share_the_cores(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(test_kernels=BENCH_TEST, test_threads=THREADS_TEST)
    db = write_csv(pytester.path / "db" / "Add.csv", HEADER, ADD_ROWS).parent
    result = pytester.runpytest_subprocess(
        "--perf-database-path", str(db), "--perf-repeat-count", "3", "--perf-warmup-count", "1",
        "-n", "2", "-p", "no:cacheprovider", timeout=240,
    )
    result.assert_outcomes(passed=2)
