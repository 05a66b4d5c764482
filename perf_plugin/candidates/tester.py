"""The judge in a process that runs cases: called by the replay runner once the reference replay
of a case was verified and timed, on the same inputs.

For a row whose kernel type has a candidate it checks the candidate over fresh input sets
(``judge.check_candidate``), and if every check passed times it with the run's collector on the
case's own inputs (the same warm-ups, repeats and cache mode as the reference) in a profiler
session holding nothing else, then compares the last timed repeat's outputs with the reference.  Verdicts wait in ``verdicts`` until a test
report carries them to the controller; measurements come back through the SplittingCollector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perf_plugin.candidates.collector import SplittingCollector
from perf_plugin.candidates.judge import (
    LastCall,
    Verdict,
    candidate_ref,
    check_after_timing,
    check_candidate,
)

if TYPE_CHECKING:
    from perf_plugin.backends.base import Backend
    from perf_plugin.profiling.collector import Collector
    from perf_plugin.replay.base import OpReplay
    from perf_plugin.run.cases import Case

# Seeds of the check input sets start here (plus the run's seed), away from the case's own.
CHECK_SEED_OFFSET = 1_000_003


@dataclass
class CandidateJudge:
    candidates: dict[str, Callable[..., Any]]
    backend: "Backend"
    checks: int
    seed: int = 0
    warmup_count: int = 5
    repeat_count: int = 30
    collector: SplittingCollector | None = None
    verdicts: list[Verdict] = field(default_factory=list)

    def wrap(self, collector: "Collector") -> SplittingCollector:
        self.collector = SplittingCollector(collector)
        return self.collector

    def candidate_for(self, case: "Case") -> Callable[..., Any] | None:
        return self.candidates.get(case.ref.kernel_type) or self.candidates.get(case.replay_kernel_type or "")

    def judge(
        self,
        case: "Case",
        replay: "OpReplay",
        args: tuple[Any, ...],
        timed_call: Callable[[Callable[..., Any], tuple[Any, ...]], Callable[[], Any]],
        before_repeat_for: Callable[[Callable[..., Any]], Callable[[], Any] | None],
    ) -> None:
        """Judge the case's candidate, if any; never raises for the candidate's faults.

        ``before_repeat_for(function)`` is the step before each timed repeat of ``function``
        (a call of the replay's inputs): the case's own, with the candidate's code where the
        step fetches the kernel's code into the cache."""
        function = self.candidate_for(case)
        if function is None or case.row is None:
            return
        ref = case.ref
        verdict = Verdict(ref.case_id, ref.kernel_type, ref.csv_file, ref.row_line)
        self.verdicts.append(verdict)
        device = self.backend.torch_device()
        seeds = [self.seed + CHECK_SEED_OFFSET + i for i in range(self.checks)]
        collector = self.collector if self.collector is not None and self.collector.kind == "in-process" else None
        try:
            if collector is not None:
                collector.isolate()  # the candidate's checks and warm-ups run outside any profiler session
            if not check_candidate(function, replay, case.row, device, self.backend.generator, seeds, self.backend.synchronize, verdict):
                return
            verdict.correct = True
            if collector is None:
                verdict.log.append("not timed: the candidate is timed only by an in-process collector")
                return
            last = LastCall(function)
            run_once = timed_call(last, args)
            for _ in range(self.warmup_count):
                run_once()
            try:
                collector.measure(candidate_ref(ref), run_once, self.repeat_count, before_repeat_for(function))
            finally:
                collector.isolate()  # a session of the candidate's timed repeats alone
            verdict.timed = True
            verdict.log.append(f"timed: {self.warmup_count} warm-ups, {self.repeat_count} repeats on the case's inputs")
            self.backend.synchronize()
            check_after_timing(last, replay, case.row, verdict)
        except Exception as exc:  # the candidate broke while timed (or its inputs could not be built)
            verdict.correct = False
            first = str(exc).splitlines()[0] if str(exc) else ""
            verdict.reason = verdict.reason or f"raised {type(exc).__name__}: {first}"
            verdict.log.append(f"FAIL {verdict.reason}")

    def take_verdicts(self) -> list[Verdict]:
        taken, self.verdicts = self.verdicts, []
        return taken
