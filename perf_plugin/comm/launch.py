"""torchrun: telling a rank from a plain process, and launching a single-node run ourselves.

``torchrun --nproc-per-node N -m pytest bench -m comm`` starts N pytest processes, each with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` in its environment (``env://`` initialisation); many nodes join through
torchrun's own rendezvous.  ``--comm-nproc N`` makes the plugin re-execute the same pytest
command line under torchrun, ``--standalone --nproc-per-node N`` (a single-node rendezvous on a
free local port, so a run left behind on the default port cannot capture it), and return its
exit status.  The agent runs as ``perf_plugin.comm.torchrun_agent``, which ends with the pytest
that started it; an interrupt of that pytest reaches the agent as SIGTERM, which stops the ranks
the way a scheduler does (each writes back what it measured), and is waited for.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.comm.settings import CommConfigError

TORCHRUN_MARKER = "TORCHELASTIC_RUN_ID"  # set by torchrun's agent in every worker
AGENT_MODULE = "perf_plugin.comm.torchrun_agent"
STOP_GRACE_S = 60.0  # an interrupted agent's time to stop its ranks (they write back) before it is killed


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
        AGENT_MODULE,
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "pytest",
        *pytest_args,
    ]


def run_torchrun(command: Sequence[str], cwd: Path, grace_s: float = STOP_GRACE_S) -> int:
    """Run the agent to its end; on Ctrl-C or SIGTERM here, SIGTERM it and wait up to ``grace_s``
    for it to stop its ranks (then kill it: its ranks die with it).  Its exit status."""
    agent = subprocess.Popen(list(command), cwd=str(cwd))
    try:
        return agent.wait()
    except KeyboardInterrupt:
        agent.send_signal(signal.SIGTERM)  # a terminal's Ctrl-C reached it already: a second stop is harmless
        try:
            agent.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        raise


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
