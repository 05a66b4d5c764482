"""A collector wrapper that keeps candidate measurements out of the reference replay's results.

The candidate is timed by the run's own collector (same profiler, same attribution), under a ref
whose case id carries ``judge.CANDIDATE_SUFFIX``, in a profiler session of its own
(``isolate`` before its checks and after its timed repeats): whatever a candidate launches can
then never spoil the reference replays' measurements, and a candidate that launches the marker
kernel itself is still timed (``attribution.own_markers``).  Everything the wrapped collector
returns passes through here: candidate results go to ``candidate_results``, the rest on to
the run, whose write-back therefore never sees a candidate's duration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from perf_plugin.candidates.judge import is_candidate_ref
from perf_plugin.results import CaseRef, CaseResult

if TYPE_CHECKING:
    from perf_plugin.profiling.collector import Collector


class SplittingCollector:
    def __init__(self, inner: "Collector") -> None:
        self.inner = inner
        self.kind = inner.kind
        self.candidate_results: list[CaseResult] = []
        self._held: list[CaseResult] = []  # reference results flushed early (flush_candidates)

    def measure(
        self, ref: CaseRef, run_once: Callable[[], Any], repeats: int, before_repeat: Callable[[], Any] | None = None
    ) -> None:
        self.inner.measure(ref, run_once, repeats, before_repeat)

    def _split(self, results: list[CaseResult]) -> list[CaseResult]:
        kept = []
        for result in results:
            if is_candidate_ref(result.ref):
                self.candidate_results.append(result)
            else:
                kept.append(result)
        return kept

    def drain(self) -> list[CaseResult]:
        held, self._held = self._held, []
        return held + self._split(self.inner.drain())

    def finish(self) -> list[CaseResult]:
        held, self._held = self._held, []
        return held + self._split(self.inner.finish())

    def isolate(self) -> None:
        """End the profiler session now (its results are kept); the next measurement starts a new one."""
        self._held.extend(self._split(self.inner.finish()))

    def flush_candidates(self) -> list[CaseResult]:
        """Flush the profiler now and hand over every candidate result (end of a worker's session,
        before the run takes its remaining results: those are kept for its ``finish``)."""
        self.isolate()
        taken, self.candidate_results = self.candidate_results, []
        return taken

    def take_candidates(self) -> list[CaseResult]:
        taken, self.candidate_results = self.candidate_results, []
        return taken
