"""Torchrun ranks hand their results to rank 0 through the rendezvous store, never waiting blind.

Every rank of ``torchrun ... -m pytest bench`` replays its share of the rows; rank 0 alone writes
the database, so the others' results must reach it at the end of the session.  They travel as
one JSON value per rank in torchrun's own key-value store (the ``TCPStore`` at
``MASTER_ADDR:MASTER_PORT`` that the agent hosts for its workers), not through a process group:

* a second ``init_process_group`` after the collective benchmarks destroyed theirs rendezvoused
  on the same store keys as the first and read the old group's addresses: half the
  ``-m comm`` runs hung in the gather until gloo's 600 s timeout;
* a key per rank needs no rank to enter a collective call: rank 0 reads what each rank wrote,
  and a rank that never writes is noticed, not waited on forever.

Liveness.  While it runs, every rank publishes a heartbeat, ``<sequence> <step>``, where the step
is the test it is running or the part of its session end it is at, and the sequence grows with
every step.  A rank that waits on another (rank 0 on each rank's results, each rank on rank 0's
receipt) gives up once the other's heartbeat has not moved for ``timeout_s`` and says which rank
stalled at which step.  A slow rank that is still replaying is waited for however long its
share takes.  A daemon thread publishes the heartbeat once a second with its own store client,
so a test costs a string assignment, not a network round trip.

Receipts.  Rank 0 journals what a rank sent (``ControllerState.add_results``) before it writes a
receipt for it; a rank settles its own journal only on that receipt.  A rank whose results rank 0
never took keeps them in its journal, which the next run (or ``perfdb resume``) writes back.

Keys live under ``perf/<run id>/<restart>/<session>``: unique to the torchrun job, to its restart
(an elastic restart reuses the store) and to the pytest session within the process.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

POLL_S = 0.2
BEAT_INTERVAL_S = 1.0
_SESSIONS = [0]  # pytest sessions of this process that gathered (pytester runs several)


class KeyValueStore(Protocol):
    """What this module uses of ``torch.distributed.Store``."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...


def namespace(environ: Mapping[str, str]) -> str:
    """The key prefix of this job, restart and pytest session (the same on every rank)."""
    _SESSIONS[0] += 1
    run_id = environ.get("TORCHELASTIC_RUN_ID", "none")
    restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"perf/{run_id}/{restart}/{_SESSIONS[0]}/"


def open_store(environ: Mapping[str, str], timeout_s: float) -> KeyValueStore:
    """A client of torchrun's store (rank 0 hosts it where the agent does not)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    agent_hosts = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    rank = int(environ["RANK"])
    store: KeyValueStore = TCPStore(
        environ["MASTER_ADDR"],
        int(environ["MASTER_PORT"]),
        is_master=not agent_hosts and rank == 0,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
        multi_tenant=True,  # the same server as a process group of this process on that port
    )
    return store


def _beat_key(prefix: str, rank: int) -> str:
    return f"{prefix}beat/{rank}"


def _result_key(prefix: str, rank: int) -> str:
    return f"{prefix}result/{rank}"


def _receipt_key(prefix: str, rank: int) -> str:
    return f"{prefix}receipt/{rank}"


class Heartbeat:
    """This rank's ``<sequence> <step>``, published once a second by a daemon thread."""

    def __init__(self, store_factory: Callable[[], KeyValueStore], prefix: str, rank: int,
                 interval_s: float = BEAT_INTERVAL_S) -> None:
        self._factory = store_factory
        self._key = _beat_key(prefix, rank)
        self._interval_s = interval_s
        self._sequence = 0
        self._step = "starting"
        self._published = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def step(self, text: str) -> None:
        """A new step (called from pytest's hooks: no I/O here)."""
        self._step = text
        self._sequence += 1

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="perf-heartbeat", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self._interval_s)

    def value(self) -> str:
        return f"{self._sequence} {self._step}"

    def _run(self) -> None:
        try:
            store = self._factory()
            while True:
                sequence = self._sequence
                if sequence != self._published:
                    store.set(self._key, self.value())
                    self._published = sequence
                if self._stop.wait(self._interval_s):
                    return
        except Exception as exc:  # noqa: BLE001 - a lost heartbeat must not take the rank's session down
            self.error = f"{type(exc).__name__}: {exc}"


@dataclass
class Watch:
    """Whether a rank's heartbeat moved within the last ``timeout_s`` (rank 0's clock only:
    no two hosts' clocks are compared)."""

    timeout_s: float
    clock: Callable[[], float] = time.monotonic
    _seen: dict[int, tuple[str | None, float]] = field(default_factory=dict)

    def stalled(self, store: KeyValueStore, prefix: str, rank: int) -> str | None:
        """None while the rank moves; else the last step it published (or that it published none)."""
        key = _beat_key(prefix, rank)
        beat = store.get(key).decode() if store.check([key]) else None
        now = self.clock()
        last, since = self._seen.get(rank, (None, now))
        if rank not in self._seen or beat != last:
            self._seen[rank] = (beat, now)
            return None
        if now - since < self.timeout_s:
            return None
        if beat is None:
            return "no step published (it never reached its first test)"
        return beat.split(" ", 1)[1] if " " in beat else beat


@dataclass
class Gathered:
    """Rank 0's view of the gather: the payloads that arrived, and why the others did not."""

    payloads: dict[int, dict[str, Any]] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)  # rank -> why
    interrupted: bool = False


def collect(
    store: KeyValueStore,
    prefix: str,
    world_size: int,
    take: Callable[[int, dict[str, Any]], None],
    watch: Watch,
    sleep: Callable[[float], None] = time.sleep,
) -> Gathered:
    """Rank 0: each other rank's payload as it arrives, handed to ``take`` and then receipted.

    Returns when every rank delivered or stalled; an interrupt (Ctrl-C, SIGTERM) stops the wait
    and keeps what arrived."""
    outcome = Gathered()
    pending = list(range(1, world_size))
    try:
        while pending:
            for rank in list(pending):
                key = _result_key(prefix, rank)
                if store.check([key]):
                    outcome.payloads[rank] = json.loads(store.get(key))
                    take(rank, outcome.payloads[rank])
                    store.set(_receipt_key(prefix, rank), "1")
                    pending.remove(rank)
                    continue
                step = watch.stalled(store, prefix, rank)
                if step is not None:
                    outcome.missing[rank] = f"no progress for {watch.timeout_s:g} s; its last step: {step}"
                    pending.remove(rank)
            if pending:
                sleep(POLL_S)
    except KeyboardInterrupt:
        outcome.interrupted = True
        for rank in pending:
            outcome.missing.setdefault(rank, "the run was interrupted while rank 0 waited for it")
    return outcome


def send(
    store: KeyValueStore,
    prefix: str,
    rank: int,
    payload: Mapping[str, Any],
    watch: Watch,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """A rank other than 0: publish its payload and wait for rank 0's receipt.  None once rank 0
    holds it; else why not (rank 0 stalled, or the run was interrupted)."""
    store.set(_result_key(prefix, rank), json.dumps(payload, separators=(",", ":")))
    receipt = _receipt_key(prefix, rank)
    try:
        while not store.check([receipt]):
            step = watch.stalled(store, prefix, 0)
            if step is not None:
                return f"rank 0 made no progress for {watch.timeout_s:g} s; its last step: {step}"
            sleep(POLL_S)
    except KeyboardInterrupt:
        return "the run was interrupted before rank 0 took this rank's results"
    return None
