"""Many hosts: the rows split deterministically across processes, and gathered where one writes.

Two launchers, one split:

* ``torchrun --nnodes H --nproc-per-node D -m pytest bench ...``: every rank (``RANK`` of
  ``WORLD_SIZE``) replays its share of the rows on its own device (``LOCAL_RANK``); at the end
  every rank sends its records and results to rank 0 through torchrun's key-value store
  (``perf_plugin.run.rank_gather``), and rank 0 alone writes the database and the reports;
* ``--perf-shard I/N`` (``I`` from 0): for schedulers that start one pytest per host (a Slurm
  array: ``--perf-shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT``); each shard writes back
  its own rows, under the database lock.

The split is round-robin over the replay cases in collection order (the database's file and row
order), so shards get the same number of cases within one and every shard computes the same split
without talking to the others.  Tests that are not replay cases run on every torchrun rank (the
collective benchmarks need them all) and in shard 0 only of a ``--perf-shard`` split.  The split
is made after every other deselection (``-m``, ``-k``): a rank holds the cases it will run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from perf_plugin.profiling.msprof import EP_SESSION_ENV
from perf_plugin.results import CaseResult
from perf_plugin.run.state import CaseRecord, ControllerState

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    index: int
    count: int
    distributed: bool  # torchrun ranks: gathered to rank 0 through torch.distributed

    def describe(self) -> str:
        how = "torchrun rank" if self.distributed else "shard"
        return f"{how} {self.index} of {self.count}"


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` with ``0 <= I < N``."""
    try:
        index_text, count_text = text.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError:
        raise ValueError(f"{text!r} is not I/N (e.g. 0/4)") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"{text!r}: I/N needs 0 <= I < N")
    return index, count


def torchrun_rank(environ: Mapping[str, str]) -> tuple[int, int, int] | None:
    """(rank, world size, local rank) of a process torchrun started with more than one rank."""
    if "TORCHELASTIC_RUN_ID" not in environ:
        return None
    try:
        rank, world, local = int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError):
        return None
    return (rank, world, local) if world > 1 else None


def current_shard(shard_option: str | None, environ: Mapping[str, str] | None = None) -> Shard | None:
    """``--perf-shard`` wins; else the torchrun rank; else None (the whole database here).

    The ranks of an expert-parallel session (``perf_plugin.run.expert_parallel``) are not shards:
    its rows are collective, and every rank runs every one of them together."""
    env = os.environ if environ is None else environ
    if env.get(EP_SESSION_ENV) == "1":
        return None
    if shard_option:
        index, count = parse_shard(shard_option)
        return Shard(index, count, distributed=False) if count > 1 else None
    ranks = torchrun_rank(env)
    return Shard(ranks[0], ranks[1], distributed=True) if ranks else None


def local_device_index(environ: Mapping[str, str] | None = None) -> int:
    """The device a torchrun rank replays on: its ``LOCAL_RANK`` (0 outside torchrun)."""
    ranks = torchrun_rank(os.environ if environ is None else environ)
    return ranks[2] if ranks else 0


def split(items: Sequence[T], is_case: Sequence[bool], shard: Shard) -> tuple[list[T], list[T]]:
    """(kept, left to other shards): every ``count``-th replay case from ``index``.  Other tests
    run on every torchrun rank (collective benchmarks need every rank, and a rank-aware test
    expects its world) and in shard 0 only of a ``--perf-shard`` split."""
    keep: list[T] = []
    drop: list[T] = []
    position = 0
    for item, case in zip(items, is_case):
        if case:
            (keep if position % shard.count == shard.index else drop).append(item)
            position += 1
        else:
            (keep if shard.distributed or shard.index == 0 else drop).append(item)
    return keep, drop


def payload(control: ControllerState, notes: Sequence[str]) -> dict[str, Any]:
    return {
        "records": {nodeid: record.to_json() for nodeid, record in control.records.items()},
        "results": [result.to_json() for result in control.results.values()],
        "notes": list(notes),
    }


def merge_payload(control: ControllerState, notes: list[str], data: Mapping[str, Any]) -> None:
    for nodeid, record in data["records"].items():
        control.records.setdefault(nodeid, CaseRecord.from_json(record))
    control.add_results([CaseResult.from_json(result) for result in data["results"]])  # one journal write
    notes.extend(note for note in data["notes"] if note not in notes)
