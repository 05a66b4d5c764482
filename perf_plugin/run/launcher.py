"""What a case runs: the replay's portable call, or the named device API's call bound once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import bind_call, resolve_api
from perf_plugin.replay.rank_group import with_comm_names
from perf_plugin.run.case_outcomes import CaseFailure, CaseSkip

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend
    from perf_plugin.replay.base import OpReplay
    from perf_plugin.replay.tensors import KernelRow


def case_launcher(
    backend: "Backend", replay: "OpReplay", row: "KernelRow", args: tuple[Any, ...]
) -> tuple[Any, tuple[Any, ...]]:
    """(function, its arguments): the replay's portable ``run`` on its inputs or, where the
    backend launches kernels through the APIs op_mapping.yaml names (an NPU), that API's call,
    bound once (inputs in private storage formats are cast here, outside the timed repeats)."""
    if not backend.launches_named_apis:
        return replay.run, args
    call = replay.npu_call(row, args)
    if call is None:
        return replay.run, args
    try:
        function = resolve_api(call.api)
    except ImportError as exc:
        raise CaseSkip(str(exc)) from None
    # an API that takes its process group by communicator name gets the active group's
    try:
        call = with_comm_names(call, lambda group: backend.group_comm_name(group.handle, group.rank))
    except (ValueError, NotImplementedError) as exc:
        raise CaseFailure(str(exc)) from None
    return bind_call(call, function, backend.format_cast), ()
