"""From settings and the world size to the ordered list of collective cases.

Every rank builds the same plan from the same options and environment, so every rank runs the
same cases in the same order (pytest collection is deterministic).  Everything that can be wrong
with the options is found here, before any process group exists, so a bad option makes every
rank exit with the same one-line message instead of leaving others waiting in a collective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perf_plugin.comm.collectives import Collective, CommDtype
from perf_plugin.comm.settings import CommConfigError, CommSettings, default_bytes_grid
from perf_plugin.comm.topology import A3_GRID, default_grid, run_tier


@dataclass(frozen=True)
class CommCase:
    op: Collective
    num_devices: int
    dtype: CommDtype
    message_bytes: int
    topology_tier: int

    @property
    def id(self) -> str:
        return f"{self.op.name}-n{self.num_devices}-{self.dtype.key}-{self.message_bytes}B"

    @property
    def count(self) -> int:
        """Elements in the message (see collectives: the gathered / scattered / sent buffer)."""
        return self.message_bytes // self.dtype.itemsize


@dataclass(frozen=True)
class CommPlan:
    world_size: int
    ccl: str
    grid: tuple[int, ...]
    group_sizes: tuple[int, ...]
    cases: tuple[CommCase, ...]


def _group_sizes(settings: CommSettings, world_size: int) -> tuple[int, ...]:
    sizes = settings.num_devices or (world_size,)
    for size in sizes:
        if size > world_size:
            launch = "torchrun --nproc-per-node N -m pytest ... or --comm-nproc N"
            raise CommConfigError(
                f"--num-devices: a group of {size} devices needs at least {size} ranks, but this run has "
                f"{world_size} (launch it with {launch})"
            )
        if world_size % size:
            raise CommConfigError(
                f"--num-devices: a group of {size} devices does not divide the world of {world_size} ranks"
            )
    return sizes


def _grid(settings: CommSettings, world_size: int, local_world_size: int, ccl: str) -> tuple[int, ...]:
    if settings.grid_shape is not None:
        grid = settings.grid_shape
    elif ccl == "hccl":
        grid = A3_GRID
    else:
        grid = default_grid(world_size, local_world_size)
    if world_size > math.prod(grid):
        raise CommConfigError(
            f"--grid-shape: {world_size} ranks do not fit the grid {' '.join(map(str, grid))} "
            f"({math.prod(grid)} devices)"
        )
    return grid


def _sizes_for(settings: CommSettings, ccl: str, op: Collective, dtype: CommDtype, n: int) -> list[int]:
    granule = op.granule_bytes(dtype, n)
    if settings.bytes_grid is not None:
        for size in settings.bytes_grid:
            if size % granule:
                raise CommConfigError(
                    f"--bytes-grid: {size} bytes is not a multiple of {granule} ({op.name} of "
                    f"{dtype.key} over {n} device{'s' if n != 1 else ''} moves whole {dtype.itemsize}-byte elements"
                    + (f" in {n} equal chunks)" if op.chunked else ")")
                )
        return list(settings.bytes_grid)
    # The default grid is rounded down to whole elements per rank (as nccl-tests rounds its
    # counts), so group sizes that are not powers of two still get a usable default.
    rounded = [(size // granule) * granule for size in default_bytes_grid(ccl)]
    return list(dict.fromkeys(size for size in rounded if size > 0))


def plan_cases(settings: CommSettings, world_size: int, local_world_size: int, ccl: str) -> CommPlan:
    """The cases of a run, ordered op -> group size -> dtype -> message size."""
    if world_size < 1:
        raise CommConfigError(f"world size {world_size} is not positive")
    group_sizes = _group_sizes(settings, world_size)
    grid = _grid(settings, world_size, local_world_size, ccl)
    tiers = {
        n: settings.topology_tier if settings.topology_tier is not None else run_tier(grid, world_size, n)
        for n in group_sizes
    }
    cases = tuple(
        CommCase(op, n, dtype, size, tiers[n])
        for op in settings.ops
        for n in group_sizes
        for dtype in settings.dtypes
        for size in _sizes_for(settings, ccl, op, dtype, n)
    )
    return CommPlan(world_size, ccl, grid, group_sizes, cases)
