"""Pick the collector for a backend: in-process torch.profiler, or msprof on an NPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from perf_plugin.profiling.torch_profiler import TorchProfilerCollector

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend
    from perf_plugin.options import Settings
    from perf_plugin.profiling.collector import Collector


def make_collector(backend: "Backend", settings: "Settings") -> "Collector":
    if backend.collector == "msprof":
        from perf_plugin.profiling.msprof import MsprofCollector

        return MsprofCollector(backend)
    return TorchProfilerCollector(
        backend, batch_size=settings.profile_batch_size, repeat_markers=settings.repeat_markers
    )
