"""Rows of collective kernels (``OpReplay.group_size`` > 1): which process groups a process can form.

A DispatchFFNCombine row with ``EP Size`` N runs over an expert-parallel group of exactly N ranks
(``perf_plugin.replay.rank_group``).  Three kinds of process see such a row at collection:

* a rank of the *expert-parallel session* (``PERF_EP_SESSION=1``, started by the controller of
  an NPU run under msprof and torchrun: ``perf_plugin.run.ep_session``): its world is torchrun's
  ``WORLD_SIZE`` ranks, and a row of that EP size is ready to run there, on every rank;
* the controller of an NPU run (or one reading ``--perf-prof-path``), and the run's main session
  under msprof: the controller will launch that session with ``--perf-dispatch-ffn-combine-ep-size``
  ranks (``EpLaunch``), so rows of that EP size are ready, to run there (the main session leaves
  them out); a row of another EP size gets one reason naming the file, row, column and the
  option to change;
* any other process (a CPU or CUDA run): it forms no group, and the row gets the reason and what
  would run it.

In the session, ``ExpertGroups`` makes the process groups when a case first asks for one: the
default group over torchrun's rendezvous with the device backend's collective library (HCCL on an
NPU, gloo on the CPU: ``Backend.ccl``), then for a size N the groups of N consecutive ranks.
``torch.distributed.new_group`` must be entered by every rank in the same order; every rank runs
the same cases in the same order, so every rank creates the same groups in the same order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perf_plugin.profiling.msprof import EP_SESSION_ENV, external_mode, is_msprof_child
from perf_plugin.replay.rank_group import RankGroup

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend
    from perf_plugin.options import Settings

EP_OPTION = "--perf-dispatch-ffn-combine-ep-size"


@dataclass(frozen=True)
class EpLaunch:
    """The expert-parallel session's torchrun (the seed's ``--dispatch-ffn-combine-*`` options)."""

    ep_size: int
    nnodes: int = 1
    nproc_per_node: int = 0  # 0: ep_size / nnodes
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @property
    def per_node(self) -> int:
        return self.nproc_per_node or self.ep_size // self.nnodes

    @property
    def world_size(self) -> int:
        return self.nnodes * self.per_node

    def torchrun_args(self) -> list[str]:
        """``python`` + these + ``-m pytest ...`` is ``torchrun --nnodes ... -m pytest ...``."""
        return [
            "-m", "torch.distributed.run", "--nnodes", str(self.nnodes), "--nproc-per-node", str(self.per_node),
            "--node-rank", str(self.node_rank), "--master-addr", self.master_addr, "--master-port", str(self.master_port),
        ]  # fmt: skip

    def describe(self) -> str:
        return f"{EP_OPTION} {self.ep_size} (torchrun --nnodes {self.nnodes} --nproc-per-node {self.per_node})"

    @classmethod
    def from_settings(cls, settings: "Settings") -> "EpLaunch":
        return cls(
            settings.dispatch_ffn_combine_ep_size,
            settings.dispatch_ffn_combine_nnodes,
            settings.dispatch_ffn_combine_nproc_per_node or 0,
            settings.dispatch_ffn_combine_node_rank,
            settings.dispatch_ffn_combine_master_addr,
            settings.dispatch_ffn_combine_master_port,
        )


@dataclass(frozen=True)
class GroupWorld:
    """The ranks a collective row can be grouped with, as one process sees them at collection."""

    size: int = 1  # 1: this process forms no group
    rank: int = 0
    launch: EpLaunch | None = None  # the controller's planned session
    session: bool = False  # a rank of the expert-parallel session

    def problem(self, column: str, group_size: int) -> str | None:
        """Why a row of ``group_size`` ranks cannot run here (None: it can)."""
        if group_size == self.size:
            return None
        if self.session:
            return f"{column} {group_size}: this expert-parallel session has {self.size} ranks"
        if self.launch is not None:
            return (
                f"{column} {group_size} does not fit the expert-parallel launch of this run, "
                f"{self.launch.describe()} = {self.size} ranks; replay these rows with {EP_OPTION} {group_size}"
            )
        return (
            f"{column} {group_size}: the kernel runs over a process group of exactly {group_size} ranks, which this "
            f"run does not form (an NPU run, --perf-backend npu, replays such rows under msprof and torchrun with "
            f"{EP_OPTION} {group_size})"
        )


def in_ep_session(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(EP_SESSION_ENV) == "1"


def group_world(settings: "Settings", backend_name: str, environ: Mapping[str, str] | None = None) -> GroupWorld:
    """What collective rows can run in this process, or will in the session it launches."""
    env = os.environ if environ is None else environ
    if in_ep_session(env):
        try:
            return GroupWorld(int(env["WORLD_SIZE"]), int(env["RANK"]), session=True)
        except (KeyError, ValueError):
            return GroupWorld(session=True)  # not under torchrun after all: a world of one
    # the controller that launches (or reads) the sessions, and its main session, which leaves
    # the collective rows out but gives the others the same reasons
    if external_mode(settings.prof_path, backend_name, env) is not None or is_msprof_child(env):
        launch = EpLaunch.from_settings(settings)
        return GroupWorld(launch.world_size, launch=launch)
    return GroupWorld()


class ExpertGroups:
    """This rank's process groups of the expert-parallel session, one per group size, made on first use."""

    def __init__(self, backend: "Backend", timeout_s: float = 600.0) -> None:
        self.backend = backend
        self.timeout_s = timeout_s
        self._groups: dict[int, RankGroup] = {}
        self._initialised_here = False

    def __call__(self, size: int) -> RankGroup:
        """The group of ``size`` ranks holding this rank; ValueError when the session cannot form it."""
        if size in self._groups:
            return self._groups[size]
        import torch.distributed as dist

        from perf_plugin.comm.ccl import CCL_SPECS

        if not dist.is_initialized():
            spec = CCL_SPECS[self.backend.ccl]
            dist.init_process_group(**spec.init_kwargs(self.timeout_s, self.backend.torch_device()))
            self._initialised_here = True
        world, rank = dist.get_world_size(), dist.get_rank()
        if size > world or world % size:
            raise ValueError(f"a group of {size} ranks does not divide this session's {world} ranks")
        mine = RankGroup(size)
        for start in range(0, world, size):  # every rank creates every group, in the same order
            handle = dist.new_group(list(range(start, start + size)))
            if start <= rank < start + size:
                mine = RankGroup(size, rank - start, handle)
        self._groups[size] = mine
        return mine

    def close(self) -> None:
        if self._initialised_here:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._initialised_here = False
        self._groups.clear()
