"""Speedup and fast_p, KernelBench's metrics, over the rows a candidate was judged on.

A row's speedup is the reference replay's mean device time over the candidate's (both from the
profiler, on the same inputs).  ``fast_p`` is the share of rows that are correct and faster
than ``p`` times the reference (speedup > p); ``fast_0`` is KernelBench's correctness rate
(correct, timed or not).  Each share is given by rows and by profiled time: the rows' weights
are their ``Profiling Average Duration(us)`` x ``Profiling Count``, so a row that costs a real
model more counts more; the time share is None where no row of the group has a weight.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from perf_plugin.options import DEFAULT_THRESHOLDS, parse_thresholds  # noqa: F401  (option parsing lives with the options)

OVERALL = "overall"


@dataclass(frozen=True)
class RowScore:
    case_id: str
    kernel_type: str
    correct: bool
    base_us: float | None  # the reference's mean device time
    gen_us: float | None  # the candidate's mean device time
    weight_us: float = 0.0
    base_source: str = "run"  # "run" (timed now) or "baseline" (baseline_time.json)

    @property
    def speedup(self) -> float | None:
        if self.base_us is None or self.gen_us is None or self.base_us <= 0 or self.gen_us <= 0:
            return None
        return self.base_us / self.gen_us

    def fast(self, p: float) -> bool:
        if not self.correct:
            return False
        if p <= 0:
            return True
        speedup = self.speedup
        return speedup is not None and speedup > p


def threshold_key(p: float) -> str:
    """``fast_1``, ``fast_1.5``: KernelBench's names."""
    return f"fast_{p:g}"


def _group(scores: Sequence[RowScore], thresholds: Sequence[float]) -> dict[str, Any]:
    weight = sum(s.weight_us for s in scores)
    correct = [s for s in scores if s.correct]
    speedups = [s.speedup for s in correct if s.speedup is not None]
    base = sum(s.base_us for s in correct if s.speedup is not None and s.base_us is not None)
    gen = sum(s.gen_us for s in correct if s.speedup is not None and s.gen_us is not None)
    shares: dict[str, dict[str, float | None]] = {}
    for p in thresholds:
        fast = [s for s in scores if s.fast(p)]
        shares[threshold_key(p)] = {
            "rows": len(fast) / len(scores) if scores else 0.0,
            "time": sum(s.weight_us for s in fast) / weight if weight > 0 else None,
        }
    return {
        "rows": len(scores),
        "correct": len(correct),
        "timed": len(speedups),
        "weight_us": weight,
        # time of the correct, timed rows taken together: the candidate's total against the reference's
        "base_time_us": base,
        "gen_time_us": gen,
        "speedup": base / gen if gen > 0 else None,
        "fast_p": shares,
    }


def fast_p_table(scores: Iterable[RowScore], thresholds: Sequence[float] = DEFAULT_THRESHOLDS) -> dict[str, dict[str, Any]]:
    """Per kernel type (sorted) and ``overall``: counts, total times and the fast_p shares."""
    rows = list(scores)
    by_type: dict[str, list[RowScore]] = {}
    for score in rows:
        by_type.setdefault(score.kernel_type, []).append(score)
    table = {kernel_type: _group(by_type[kernel_type], thresholds) for kernel_type in sorted(by_type)}
    table[OVERALL] = _group(rows, thresholds)
    return table


def table_lines(table: dict[str, dict[str, Any]], thresholds: Sequence[float]) -> list[str]:
    """The terminal's table: one line per kernel type and overall, each share by rows / by time."""
    names = [threshold_key(p) for p in thresholds]
    header = f"{'kernel type':<24} {'rows':>5} {'correct':>7} {'speedup':>8}  " + "  ".join(f"{n + ' rows/time':>20}" for n in names)
    lines = [header]
    for group, entry in table.items():
        speedup = entry["speedup"]
        cells = []
        for name in names:
            share = entry["fast_p"][name]
            time = "-" if share["time"] is None else f"{share['time']:.3f}"
            cells.append(f"{share['rows']:.3f} / {time}".rjust(20))
        lines.append(
            f"{group:<24} {entry['rows']:>5} {entry['correct']:>7} {('-' if speedup is None else f'{speedup:.3f}'):>8}  "
            + "  ".join(cells)
        )
    return lines
