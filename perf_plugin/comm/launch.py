"""torchrun: telling a rank from a plain process, and launching a single-node run ourselves.

``torchrun --nproc-per-node N -m pytest bench -m comm`` starts N pytest processes, each with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` in its environment (``env://`` initialisation); many nodes join through
torchrun's own rendezvous.  ``--comm-nproc N`` makes the plugin re-execute the same pytest
command line under ``python -m torch.distributed.run --standalone --nproc-per-node N`` (a
single-node rendezvous on a free local port) and return its exit status.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from perf_plugin.comm.settings import CommConfigError

TORCHRUN_MARKER = "TORCHELASTIC_RUN_ID"  # set by torchrun's agent in every worker


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launched: bool  # started by torchrun (env:// initialisation)


def under_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return TORCHRUN_MARKER in env or all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def rank_info(environ: Mapping[str, str] | None = None) -> RankInfo:
    """This process's place in the run: from torchrun's variables, or a world of one."""
    env = os.environ if environ is None else environ
    if not under_torchrun(env):
        return RankInfo(0, 1, 0, 1, launched=False)
    try:
        rank = int(env["RANK"])
        world = int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", "0"))
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    except (KeyError, ValueError) as exc:
        raise CommConfigError(f"torchrun's environment is incomplete or malformed ({exc})") from None
    return RankInfo(rank, world, local_rank, local_world, launched=True)


def torchrun_command(nproc: int, pytest_args: Sequence[str], python: str | None = None) -> list[str]:
    """The command that re-runs ``pytest <pytest_args>`` as ``nproc`` ranks on this node."""
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "pytest",
        *pytest_args,
    ]


def visible_device_count(variable: str | None, environ: Mapping[str, str] | None = None) -> int | None:
    """How many devices ``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES`` lists (None: unset)."""
    env = os.environ if environ is None else environ
    if not variable or variable not in env:
        return None
    return len([d for d in env[variable].split(",") if d.strip()])


def check_visible_devices(variable: str | None, nproc: int, environ: Mapping[str, str] | None = None) -> None:
    """Each rank uses device ``LOCAL_RANK`` of the visible ones: there must be enough of them."""
    count = visible_device_count(variable, environ)
    if count is not None and count < nproc:
        raise CommConfigError(
            f"{nproc} ranks need {nproc} devices, but {variable} lists {count}; widen or unset it"
        )
