"""The process group a collective kernel's replay runs in.

Most kernels run on one device.  A few also talk to other ranks while they run: DispatchFFNCombine
sends each token to the rank that owns its expert and back (expert parallelism), so its row says
how many ranks the kernel spanned (``EP Size``) and the replay needs a process group of exactly
that many ranks.  A replay says so through ``OpReplay.group_size(row)``; the run (``perf_plugin.run``)
decides whether this process can form such a group, creates it, and makes it *active* around the
case (``group_scope``), so that the replay's ``check``, ``make_inputs``, ``run``, ``reference`` and
``npu_call`` see it through ``active_group()`` without a change to their signatures.

While cases are collected the group is only planned: ``RankGroup.handle`` is None, the size is
known.  When the case runs, ``handle`` is the ``torch.distributed`` process group.  An API that
takes the group by its communicator name (a name the collective library makes up once the group
exists) gets a ``CommName`` marker in its ``ApiCall``, which the run replaces with the name the
device backend reads from the group (``Backend.group_comm_name``) before the call is bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from perf_plugin.replay.api_call import ApiCall


@dataclass(frozen=True)
class RankGroup:
    """A group of ``size`` ranks; this process is ``rank`` in it (0 .. size - 1)."""

    size: int
    rank: int = 0
    handle: Any = None  # the torch.distributed process group; None while the group is only planned


@dataclass(frozen=True)
class CommName:
    """An API argument: the communicator name of the active group of ``size`` ranks."""

    size: int


_ACTIVE: ContextVar[RankGroup | None] = ContextVar("perf_rank_group", default=None)


def active_group() -> RankGroup | None:
    """The group the current case runs in (None: a single process)."""
    return _ACTIVE.get()


@contextmanager
def group_scope(group: RankGroup | None) -> Iterator[None]:
    """Make ``group`` the active one for the duration of the block."""
    token = _ACTIVE.set(group)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def with_comm_names(call: ApiCall, name_of: Callable[[RankGroup], str]) -> ApiCall:
    """``call`` with every ``CommName`` argument replaced by the active group's name.

    Raises ValueError when there is no active group of that size: the call cannot be made."""

    def convert(value: Any) -> Any:
        if not isinstance(value, CommName):
            return value
        group = active_group()
        if group is None or group.handle is None or group.size != value.size:
            raise ValueError(f"the call needs the communicator of a process group of {value.size} rank(s), and none is active")
        return name_of(group)

    if not any(isinstance(v, CommName) for v in (*call.args, *call.kwargs.values())):
        return call
    return dataclasses.replace(
        call, args=tuple(convert(a) for a in call.args), kwargs={k: convert(v) for k, v in call.kwargs.items()}
    )
