"""Plain data that travels from a replay case to write-back and reports.

``CaseResult`` is what one case produced.  It is JSON-serialisable through ``to_json`` /
``from_json`` because with pytest-xdist it travels from a worker to the controller inside the
test report's ``user_properties``.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

OUTCOME_PASSED = "passed"
OUTCOME_FAILED = "failed"
OUTCOME_SKIPPED = "skipped"
OUTCOME_QUARANTINED = "quarantined"
OUTCOME_NO_REPLAY = "no-replay"


@dataclass(frozen=True)
class KernelTime:
    """One device kernel (or CPU op) the case launched: mean duration per repeat and calls per repeat."""

    name: str
    mean_us: float
    calls_per_repeat: float


@dataclass(frozen=True)
class CaseResult:
    case_id: str
    kernel_type: str  # the CSV (kernel type) the case came from
    csv_file: str  # file name inside the database directory
    row_line: int | None  # 1-based line of the source row, None for generated cases
    signature_key: str  # signature_text of the row, used to match rows at write-back
    outcome: str
    reason: str = ""
    backend: str = ""
    samples_us: tuple[float, ...] = ()
    kernels: tuple[KernelTime, ...] = ()
    # The kernel type the profiler reported, when it differs from the CSV's (MatMulV2/V3/Common
    # all replay through torch.mm; on an NPU the measurement goes to the reported type's CSV).
    reported_kernel_type: str | None = None
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def has_duration(self) -> bool:
        return bool(self.samples_us)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["samples_us"] = list(self.samples_us)
        data["kernels"] = [asdict(k) for k in self.kernels]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CaseResult":
        values = dict(data)
        values["samples_us"] = tuple(values.get("samples_us", ()))
        values["kernels"] = tuple(KernelTime(**k) for k in values.get("kernels", ()))
        return cls(**values)


@dataclass(frozen=True)
class SampleStats:
    """Statistics of the steady-state samples written back to a row.

    ``mean`` is what ``Average Duration(us)`` holds: the arithmetic mean of the per-repeat
    durations after warm-up (the same statistic as ``Profiling Average Duration(us)``, so the two
    compare like for like); median, min, std (population) and count go in the added columns.
    """

    mean: float
    median: float
    minimum: float
    std: float
    count: int

    @classmethod
    def of(cls, samples: tuple[float, ...] | list[float]) -> "SampleStats":
        values = list(samples)
        if not values:
            raise ValueError("no samples")
        return cls(
            mean=statistics.fmean(values),
            median=statistics.median(values),
            minimum=min(values),
            std=statistics.pstdev(values) if len(values) > 1 else 0.0,
            count=len(values),
        )
