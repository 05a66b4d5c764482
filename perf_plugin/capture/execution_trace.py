"""An execution trace observer writing beside a trace, where ``perfdb ingest`` looks for it.

PyTorch's execution trace records which tensors each operator read and wrote, which a Kineto
trace does not; ingest uses it to find each input's producer (``perf_plugin.ingest.execution_trace``)::

    with torch.profiler.profile(activities=..., record_shapes=True, profile_memory=True,
                                execution_trace_observer=execution_trace_observer("run.json")) as prof:
        step()
    prof.export_chrome_trace("run.json")   # and run.et.json beside it

It costs host time per operator while profiling, not device time: the kernels' durations are the
profile's own.  PyTorch traces only; an Ascend profile's rows come from its kernel tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perf_plugin.trace.values_file import EXECUTION_TRACE_SUFFIX, sidecar_path


def execution_trace_observer(trace: str | Path) -> Any:
    """A ``torch.profiler.ExecutionTraceObserver`` that writes ``<trace>.et.json`` beside
    ``trace`` (``run.json`` -> ``run.et.json``), for ``profile(execution_trace_observer=...)``."""
    from torch.profiler import ExecutionTraceObserver

    return ExecutionTraceObserver().register_callback(str(sidecar_path(trace, EXECUTION_TRACE_SUFFIX)))
