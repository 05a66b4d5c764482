"""Topology tiers: which level of the machine a group of ranks spans.

``topology_tier`` in the collective databases is 0 (inter-pod), 1 (intra-pod) or 2 (die-level).
The machine is a grid of devices, outermost dimension first: A2 is ``128 8`` (128 pods of 8
NPUs), A3 is ``48 8 2`` (48 pods of 8 chips of 2 dies).  Global ranks are laid out over the grid
row-major, as torchrun numbers them (node by node, device by device).

Derivation, for a grid ``d0 d1 ... d(k-1)`` (2 or 3 dimensions):

* the level-``j`` block (``j`` = 1 .. k-1) is ``d_j * ... * d(k-1)`` consecutive ranks;
* a group's tier is the largest ``j`` such that all its ranks lie in one level-``j`` block,
  and 0 if none does (the group spans pods).

So on A3 (``48 8 2``) a group inside one chip's two dies is tier 2, a group inside one pod of 16
dies is tier 1, anything larger is tier 0; on A2 (``128 8``) a group inside one pod of 8 is tier 1
and anything larger tier 0 (A2 has no die level).  When the world is split into several groups
that run at once, the run's tier is the lowest tier of any group: the slowest link sets the time.

Without ``--grid-shape`` the grid is ``nodes x processes-per-node`` as torchrun reports it
(``WORLD_SIZE / LOCAL_WORLD_SIZE`` by ``LOCAL_WORLD_SIZE``): a group within one host is tier 1,
a group across hosts tier 0.  HCCL runs default to the A3 grid ``48 8 2`` as the seed's tool did.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

TIER_INTER_POD = 0
TIER_INTRA_POD = 1
TIER_DIE = 2
TIERS = (TIER_INTER_POD, TIER_INTRA_POD, TIER_DIE)
A3_GRID = (48, 8, 2)
A2_GRID = (128, 8)


def parse_grid_shape(text: str) -> tuple[int, ...]:
    """``"48 8 2"``, ``48,8,2`` or ``48x8x2`` -> (48, 8, 2); ValueError otherwise."""
    tokens = [t for t in re.split(r"[\s,xX*]+", text.strip()) if t]
    try:
        dims = tuple(int(t) for t in tokens)
    except ValueError:
        raise ValueError(f"grid shape {text!r} is not a list of integers (e.g. '48 8 2')") from None
    check_grid(dims)
    return dims


def check_grid(dims: Sequence[int]) -> None:
    if len(dims) not in (2, 3):
        raise ValueError(
            f"grid shape {' '.join(map(str, dims)) or '(empty)'} must have 2 dimensions "
            "(pods x devices, A2: 128 8) or 3 (pods x chips x dies, A3: 48 8 2)"
        )
    if any(d < 1 for d in dims):
        raise ValueError(f"grid shape {' '.join(map(str, dims))} has a dimension below 1")


def group_tier(dims: Sequence[int], ranks: Sequence[int]) -> int:
    """The tier of one group of global ranks on the grid (see the module docstring)."""
    check_grid(dims)
    if not ranks:
        raise ValueError("a group has at least one rank")
    capacity = math.prod(dims)
    if max(ranks) >= capacity or min(ranks) < 0:
        raise ValueError(f"rank {max(ranks)} lies outside the grid {' '.join(map(str, dims))} ({capacity} devices)")
    tier = TIER_INTER_POD
    for level in range(1, len(dims)):
        block = math.prod(dims[level:])
        if len({rank // block for rank in ranks}) == 1:
            tier = level
    return min(tier, TIER_DIE)


def consecutive_groups(world_size: int, group_size: int) -> list[list[int]]:
    """The world split into ``world_size / group_size`` groups of consecutive ranks."""
    if group_size < 1 or world_size % group_size:
        raise ValueError(f"a group of {group_size} does not divide a world of {world_size} ranks")
    return [list(range(start, start + group_size)) for start in range(0, world_size, group_size)]


def run_tier(dims: Sequence[int], world_size: int, group_size: int) -> int:
    """The tier of a run whose world is split into consecutive groups of ``group_size``."""
    return min(group_tier(dims, group) for group in consecutive_groups(world_size, group_size))


def default_grid(world_size: int, local_world_size: int) -> tuple[int, int]:
    """``nodes x processes-per-node`` from what torchrun reports."""
    if local_world_size < 1 or world_size % local_world_size:
        # uneven nodes (or no torchrun): treat the whole world as one pod
        return (1, max(world_size, 1))
    return (world_size // local_world_size, local_world_size)
