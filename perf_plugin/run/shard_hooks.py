"""Hooks of a sharded run (``perf_plugin.run.shards`` says how rows are split;
``perf_plugin.run.rank_gather`` how torchrun ranks hand their results to rank 0)."""

from __future__ import annotations

import os

import pytest

from perf_plugin.run import rank_gather
from perf_plugin.run.controller_hooks import case_of
from perf_plugin.run.shards import Shard, current_shard, merge_payload, payload
from perf_plugin.run.shards import split as split_items
from perf_plugin.run.state import RUN_STATE, RunState

# an interrupted run: the other ranks were interrupted too and send at once, or never will
INTERRUPTED_WAIT_S = 10.0


class ShardHooks:
    """Registered in every process: each keeps its shard's cases; torchrun ranks gather to rank 0."""

    def __init__(self, config: pytest.Config, shard_option: str | None, rank_timeout_s: float = 300.0) -> None:
        self.config = config
        self.rank_timeout_s = rank_timeout_s
        self._writes_here: bool | None = None  # once gathered
        self.total_cases = 0  # replay cases of the whole run, every rank's
        self.failures: list[str] = []  # ranks whose results did not reach rank 0, and why
        self.heartbeat: rank_gather.Heartbeat | None = None
        self.interrupted = False  # the session ended by Ctrl-C or SIGTERM
        try:
            self.shard: Shard | None = current_shard(shard_option)
        except ValueError as exc:
            raise pytest.UsageError(f"--perf-shard: {exc}") from None
        # the same on every rank: each rank makes one ShardHooks per pytest session
        self.prefix = rank_gather.namespace(os.environ) if self.shard is not None and self.shard.distributed else ""

    @pytest.hookimpl(trylast=True)  # after -m, -k and every other deselection
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if self.shard is None:
            return
        is_case = [case_of(item) is not None for item in items]
        self.total_cases = sum(is_case)
        keep, drop = split_items(items, is_case, self.shard)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
        state: RunState | None = config.stash.get(RUN_STATE, None)
        if state is not None and state.controller is not None and self.shard.distributed:
            state.control.selected_cases = self.total_cases  # rank 0 writes them all: what is left is of all
        if state is not None:
            cases = sum(case_of(item) is not None for item in keep)
            state.notes.append(f"{self.shard.describe()}: {cases} of {self.total_cases} replay case(s) here")
        if self._gathers() and not config.option.collectonly:
            self.heartbeat = rank_gather.Heartbeat(self._open_store, self.prefix, self.shard.index)
            self.heartbeat.start()
            config.add_cleanup(self.heartbeat.stop)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self.heartbeat is not None:
            self.heartbeat.step(f"running {nodeid}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, exitstatus: int) -> None:
        self.interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        if self.heartbeat is not None:
            self.heartbeat.step("session end: flushing the profiler")

    def _gathers(self) -> bool:
        """Torchrun ranks with replay cases somewhere: the results go to rank 0.  A run of
        collectives only (or of nothing) gathers nothing: no rank waits on another."""
        return self.shard is not None and self.shard.distributed and self.total_cases > 0

    def _open_store(self) -> rank_gather.KeyValueStore:
        return rank_gather.open_store(os.environ, self.rank_timeout_s)

    def writes_here(self, state: RunState) -> bool:
        """Controller, at the end: whether this process writes back, the ranks' results gathered
        to rank 0 on the first call (by the pytest-benchmark bridge, or else by write-back)."""
        if self.shard is None or not self.shard.distributed or state.controller is None:
            return True
        if self._writes_here is None:
            self._writes_here = self._gather(state)
        return self._writes_here

    def _gather(self, state: RunState) -> bool:
        assert self.shard is not None
        rank = self.shard.index
        if not self._gathers():
            return rank == 0
        timeout_s = min(self.rank_timeout_s, INTERRUPTED_WAIT_S) if self.interrupted else self.rank_timeout_s
        watch = rank_gather.Watch(timeout_s)
        if self.heartbeat is not None:
            self.heartbeat.step("session end: gathering results" if rank == 0 else "session end: sending results")
        try:
            store = self._open_store()
        except (RuntimeError, ValueError, KeyError) as exc:  # torch's store errors are RuntimeErrors
            self.failures.append(f"torchrun's store could not be reached ({exc}): results stay with each rank")
            return rank == 0
        if rank == 0:
            control, notes = state.control, state.notes
            gathered = rank_gather.collect(
                store, self.prefix, self.shard.count, lambda _rank, data: merge_payload(control, notes, data), watch
            )
            self.failures.extend(
                f"rank {other} of {self.shard.count}: results not received: {why}; they stay in that rank's journal "
                f"(the next run, or perfdb resume, writes them)"
                for other, why in sorted(gathered.missing.items())
            )
            return True
        why = rank_gather.send(store, self.prefix, rank, payload(state.control, state.notes), watch)
        if why is not None:
            self.failures.append(f"rank {rank}: results not taken by rank 0: {why}")
        return False

    @property
    def delivered(self) -> bool:
        """A rank other than 0: rank 0 holds its results (its journal may go)."""
        return not self.failures

