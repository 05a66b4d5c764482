"""The seam between the harness and the profilers.

Two kinds of collectors:

* **in-process** (``TorchProfilerCollector``): the test process runs each case's timed repeats
  under ``torch.profiler`` and attributes device kernels to cases itself.  Results become
  available in batches (one profiler session spans ``profile_batch_size`` cases, because
  starting and stopping the profiler per case would cost more than a small kernel's whole
  measurement).  ``drain()`` hands over finished results; the plugin attaches them to the next
  test report so they reach the controller even under pytest-xdist.
* **whole-run external** (msprof on an NPU): the whole pytest session runs under the external
  profiler; ``measure`` only runs the repeats (inside a labelled range where the device supports
  one) and returns nothing; at session end the controller reads the profiler's output and
  matches its rows to database rows by signature (``perf_plugin.run.msprof_launch``
  and ``perf_plugin.profiling.msprof_match``).

Both implement ``Collector``; the plugin does not know which one it drives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from perf_plugin.results import CaseRef, CaseResult


class Collector(Protocol):
    kind: str  # "in-process" or "external"

    def measure(self, ref: CaseRef, run_once: Callable[[], Any], repeats: int, before_repeat: Callable[[], Any] | None = None) -> None:
        """Run ``run_once`` ``repeats`` times as the timed region of the case ``ref`` names."""

    def drain(self) -> list[CaseResult]:
        """Results that are complete now (may flush the profiler when a batch is full)."""

    def finish(self) -> list[CaseResult]:
        """Flush everything pending (end of the process)."""
