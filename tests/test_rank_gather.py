"""Torchrun ranks' results to rank 0 through a key-value store: delivered, receipted, or named as stalled.

The ranks are threads over torch's in-memory ``HashStore`` (the same ``Store`` interface as
torchrun's ``TCPStore``); time is a fake clock that each poll advances, so the stall limits are
exercised without waiting for them.  The real torchrun runs are in ``test_comm_torchrun.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch.distributed as dist

from perf_plugin.run import rank_gather
from perf_plugin.run.rank_gather import Heartbeat, Watch, collect, send

PREFIX = "perf/test/0/1/"


class FakeTime:
    """A clock that only sleeping advances (every waiting loop here sleeps between polls)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.lock = threading.Lock()

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds


def _store() -> Any:
    return dist.HashStore()  # type: ignore[attr-defined]


def test_rank_zero_takes_every_rank_s_payload_and_each_rank_gets_its_receipt() -> None:
    store, fake = _store(), FakeTime()
    taken: dict[int, dict[str, Any]] = {}
    answers: dict[int, str | None] = {}

    def rank(number: int) -> None:
        answers[number] = send(store, PREFIX, number, {"results": [number]}, Watch(30, fake.clock), threading.Event().wait)

    senders = [threading.Thread(target=rank, args=(n,)) for n in (1, 2, 3)]
    for thread in senders:
        thread.start()
    gathered = collect(store, PREFIX, 4, lambda r, data: taken.__setitem__(r, data), Watch(30, fake.clock),
                       threading.Event().wait)
    for thread in senders:
        thread.join(timeout=10)
    assert gathered.missing == {} and not gathered.interrupted
    assert taken == {1: {"results": [1]}, 2: {"results": [2]}, 3: {"results": [3]}}
    assert answers == {1: None, 2: None, 3: None}


def test_a_rank_that_never_sends_is_named_with_its_last_step_after_the_limit() -> None:
    store, fake = _store(), FakeTime()
    store.set(f"{PREFIX}beat/1", "7 running bench/test_kernels.py::test_replay[Add-1]")
    gathered = collect(store, PREFIX, 3, lambda r, d: None, Watch(5, fake.clock), fake.sleep)
    assert gathered.missing == {
        1: "no progress for 5 s; its last step: running bench/test_kernels.py::test_replay[Add-1]",
        2: "no progress for 5 s; its last step: no step published (it never reached its first test)",
    }
    assert 5 <= fake.now < 6  # waited the limit, not longer


def test_a_slow_rank_that_keeps_moving_is_waited_for_past_the_limit() -> None:
    store, fake = _store(), FakeTime()
    polls = [0]

    def sleep(seconds: float) -> None:
        fake.sleep(seconds)
        polls[0] += 1
        store.set(f"{PREFIX}beat/1", f"{polls[0]} running case {polls[0]}")  # a case done every poll
        if fake.now >= 50:  # ten times the limit: then it sends
            store.set(f"{PREFIX}result/1", '{"n": 1}')

    gathered = collect(store, PREFIX, 2, lambda r, d: None, Watch(5, fake.clock), sleep)
    assert gathered.missing == {} and fake.now >= 50
    assert store.get(f"{PREFIX}receipt/1") == b"1"


def test_a_rank_whose_rank_zero_stalls_says_so_and_keeps_its_results() -> None:
    store, fake = _store(), FakeTime()
    store.set(f"{PREFIX}beat/0", "3 session end: flushing the profiler")
    why = send(store, PREFIX, 1, {"results": []}, Watch(5, fake.clock), fake.sleep)
    assert why == "rank 0 made no progress for 5 s; its last step: session end: flushing the profiler"


def test_an_interrupt_stops_the_wait_and_keeps_what_arrived() -> None:
    store, fake = _store(), FakeTime()
    store.set(f"{PREFIX}result/1", '{"n": 1}')

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    taken: list[int] = []
    gathered = collect(store, PREFIX, 3, lambda r, d: taken.append(r), Watch(300, fake.clock), interrupted)
    assert gathered.interrupted and taken == [1]
    assert gathered.missing == {2: "the run was interrupted while rank 0 waited for it"}


def test_the_heartbeat_publishes_each_new_step_from_its_thread() -> None:
    store = _store()
    beat = Heartbeat(lambda: store, PREFIX, 2, interval_s=0.01)
    beat.step("running a")
    beat.start()
    try:
        store.wait([f"{PREFIX}beat/2"])
        beat.step("session end: sending results")
        deadline = threading.Event()
        for _ in range(500):
            if store.get(f"{PREFIX}beat/2") == b"2 session end: sending results":
                break
            deadline.wait(0.01)
        assert store.get(f"{PREFIX}beat/2") == b"2 session end: sending results"
    finally:
        beat.stop()
    assert beat.error is None


def test_namespaces_differ_by_job_restart_and_session() -> None:
    env = {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "1"}
    first, second = rank_gather.namespace(env), rank_gather.namespace(env)
    assert first.startswith("perf/job/1/") and second.startswith("perf/job/1/") and first != second
    assert rank_gather.namespace({"TORCHELASTIC_RUN_ID": "other"}).startswith("perf/other/0/")


@pytest.mark.parametrize("rank,agent_hosts,master", [(0, "True", False), (1, "False", False), (0, "False", True)])
def test_the_store_is_a_client_of_torchrun_s_unless_rank_zero_must_host_it(
    monkeypatch: pytest.MonkeyPatch, rank: int, agent_hosts: str, master: bool
) -> None:
    made: dict[str, Any] = {}

    def fake_store(host: str, port: int, **kwargs: Any) -> object:
        made.update(host=host, port=port, **kwargs)
        return object()

    monkeypatch.setattr(dist, "TCPStore", fake_store)
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "RANK": str(rank), "TORCHELASTIC_USE_AGENT_STORE": agent_hosts}
    rank_gather.open_store(env, 30)
    assert made["host"] == "10.0.0.1" and made["port"] == 29400
    assert made["is_master"] is master and made["wait_for_workers"] is False and made["multi_tenant"] is True
