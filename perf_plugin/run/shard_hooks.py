"""Hooks of a sharded run (``perf_plugin.run.shards`` says how rows are split and gathered)."""

from __future__ import annotations

import pytest

from perf_plugin.run.controller_hooks import case_of
from perf_plugin.run.shards import Shard, current_shard, gather_to_rank_zero
from perf_plugin.run.shards import split as split_items
from perf_plugin.run.state import RUN_STATE, RunState


class ShardHooks:
    """Registered in every process: each keeps its shard's cases; torchrun ranks gather to rank 0."""

    def __init__(self, config: pytest.Config, shard_option: str | None) -> None:
        self.config = config
        self._writes_here: bool | None = None  # once gathered
        try:
            self.shard: Shard | None = current_shard(shard_option)
        except ValueError as exc:
            raise pytest.UsageError(f"--perf-shard: {exc}") from None

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if self.shard is None:
            return
        keep, drop = split_items(items, [case_of(item) is not None for item in items], self.shard)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
        state: RunState | None = config.stash.get(RUN_STATE, None)
        if state is not None:
            cases = sum(case_of(item) is not None for item in keep)
            state.notes.append(f"{self.shard.describe()}: {cases} replay case(s) here")

    def writes_here(self, state: RunState) -> bool:
        """Controller, at the end: whether this process writes back, the ranks' results gathered
        to rank 0 on the first call (by the pytest-benchmark bridge, or else by write-back)."""
        if self.shard is None or not self.shard.distributed or state.controller is None:
            return True
        if self._writes_here is None:
            self._writes_here = gather_to_rank_zero(state.controller, state.notes)
        return self._writes_here
