"""A tensor list's shapes and dtypes, from the execution trace where the profile leaves them out.

The Kineto trace records a tensor list argument's dims and strides only up to 30 tensors: a
``torch.stack`` of 31 or more (the per-step outputs a Mamba block's sequential scan stacks, 512
of them on a 512-token prefill; an optimizer's ``_foreach_`` update of every parameter) records
``[]`` for the list, and the row then has no arguments to replay.  It never records the dtype of
a list's tensors (``TensorList``), which ``perf_plugin.ingest.list_dtypes`` infers from the
kernels and readers around a ``cat``.

The execution trace beside the profile (``<trace>.et.json``) records every tensor of the list with
its shape, strides and element type (``GenericList[Tensor(c10::BFloat16),...]``), on the node
whose ``rf_id`` is the operator's ``Record function id``.  Where it has the operator, its list
fills the dims and strides the profile left out and gives the list's dtypes; a list the profile
recorded is kept as it is and takes the dtypes only where the shapes agree.
"""

from __future__ import annotations

from collections.abc import Iterable

from perf_plugin.ingest.execution_trace import ExecutionTrace, TracedList
from perf_plugin.trace.args import TRACE_DTYPES
from perf_plugin.trace.events import TraceOp

LIST_TYPE = "TensorList"


def has_lists_to_complete(ops: Iterable[TraceOp]) -> bool:
    """Whether an operator has a tensor list whose dtypes are not known yet, which the execution
    trace would give: the profile never records them (a small ``cat`` in a CPU trace has no kernels
    or output dtype to infer them from either), and a list it left out (``[]``) has none."""
    return any(kind == LIST_TYPE and index not in op.list_dtypes for op in ops for index, kind in enumerate(op.types))


def complete_tensor_lists(ops: Iterable[TraceOp], execution: ExecutionTrace) -> int:
    """Fill the tensor lists of ``ops`` from ``execution``: the dims and strides where the profile
    left them out, the dtypes where the shapes agree.  Returns how many lists took dims."""
    filled = 0
    for op in ops:
        call = execution.get(op.record_id) if op.record_id is not None else None
        if call is None:
            continue
        for index, traced in call.lists.items():
            if index >= len(op.types) or op.types[index] != LIST_TYPE or index >= len(op.dims):
                continue
            if op.dims[index] == []:
                _fill_dims(op, index, traced)
                filled += 1
            if [list(shape) for shape in traced.shapes] == op.dims[index]:
                dtypes = tuple(TRACE_DTYPES.get(name, "") for name in traced.dtypes)
                if all(dtypes):
                    op.list_dtypes[index] = dtypes
    return filled


def _fill_dims(op: TraceOp, index: int, traced: TracedList) -> None:
    op.dims[index] = [list(shape) for shape in traced.shapes]
    if traced.strides is None:
        return
    while len(op.strides) < len(op.dims):
        op.strides.append([])
    op.strides[index] = [list(steps) for steps in traced.strides]
