"""Plain data that travels from a replay case to write-back and reports.

``CaseRef`` is which database row a case is: made once when the row is collected (its
signature computed then) and carried unchanged by everything downstream, up to the CSV cell the
measurement lands in.  ``CaseResult`` is what one case produced.  Both are JSON-serialisable
through ``to_json`` / ``from_json`` because with pytest-xdist they travel from a worker to the
controller inside the test report's ``user_properties``.
"""

from __future__ import annotations

import math
import statistics
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, overload

from perf_plugin.database.kernel_breakdown import KernelDifference, kernel_difference


class CollectedCase(Protocol):
    """A case as the collection made it (``perf_plugin.run.cases.Case``), seen from the layers
    below the run: its identity, and whether it can run."""

    @property
    def ref(self) -> CaseRef: ...

    @property
    def runnable(self) -> bool: ...


OUTCOME_PASSED = "passed"
OUTCOME_FAILED = "failed"
OUTCOME_SKIPPED = "skipped"
OUTCOME_QUARANTINED = "quarantined"  # a cell of the row cannot be parsed: set aside
OUTCOME_UNSUPPORTED = "unsupported"  # the replay cannot build the row: left in its CSV
OUTCOME_NO_REPLAY = "no-replay"


@dataclass(frozen=True, slots=True)
class CaseRef:
    """The identity of one case: the row it replays and how a measurement finds that row again."""

    case_id: str  # the pytest parameter id (kernel type, shapes, dtypes; ``#2`` for a repeat)
    kernel_type: str  # the CSV (kernel type) the row is in
    csv_file: str  # file name inside the database directory
    row_line: int | None  # 1-based line of the row; None for a measurement no row produced
    signature_key: str  # ``signature_text`` of the row, computed once at collection

    def to_json(self) -> dict[str, Any]:
        return {
            "case_id": self.case_id,
            "kernel_type": self.kernel_type,
            "csv_file": self.csv_file,
            "row_line": self.row_line,
            "signature_key": self.signature_key,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseRef:
        line = data.get("row_line")
        # interned: a case's reference arrives twice (its record, its result) beside the one
        # collected, and all three share the same texts (sys.intern at collection too)
        return cls(
            sys.intern(str(data["case_id"])),
            sys.intern(str(data["kernel_type"])),
            sys.intern(str(data["csv_file"])),
            None if line is None else int(line),
            sys.intern(str(data["signature_key"])),
        )


class Samples(Sequence[float]):
    """A case's per-repeat durations, stored as C doubles.

    The controller keeps every case's result until write-back: as a tuple, 30 samples are 31
    Python objects (~1 KB, allocated outside Python's small-object arenas); here they are one
    ~300-byte buffer.  Read-only, and equal to any sequence of the same values, so a result
    compares as it did with a tuple.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Iterable[float] = ()) -> None:
        self._values = array("d", values)

    def __len__(self) -> int:
        return len(self._values)

    @overload
    def __getitem__(self, index: int) -> float: ...
    @overload
    def __getitem__(self, index: slice) -> Samples: ...
    def __getitem__(self, index: int | slice) -> float | Samples:
        if isinstance(index, slice):
            return Samples(self._values[index])
        return self._values[index]

    def __iter__(self) -> Iterator[float]:
        return iter(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Samples):
            return self._values == other._values
        if isinstance(other, (tuple, list)):
            return len(other) == len(self._values) and all(a == b for a, b in zip(self._values, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to tuples, which hash differently

    def __repr__(self) -> str:
        return f"Samples({list(self._values)!r})"


@dataclass(frozen=True, slots=True)
class KernelTime:
    """One device kernel (or CPU op) the case launched: mean duration per repeat and calls per repeat."""

    name: str
    mean_us: float
    calls_per_repeat: float


@dataclass(frozen=True, slots=True)  # one per case, held by the controller until write-back
class CaseResult:
    ref: CaseRef
    outcome: str
    reason: str = ""
    backend: str = ""
    samples_us: Sequence[float] = ()  # a tuple where measured, ``Samples`` once carried as JSON
    kernels: tuple[KernelTime, ...] = ()
    # The kernel type the profiler reported, when it differs from the CSV's (MatMulV2/V3/Common
    # all replay through torch.mm; on an NPU the measurement goes to the reported type's CSV).
    reported_kernel_type: str | None = None
    counters: dict[str, float] = field(default_factory=dict)
    # Identity cells of the measured kernel (OP State ... Output Formats), for appending a row
    # when a measurement matches no row (update mode ``all``); empty for in-process results,
    # which always come from a row.
    identity: dict[str, str] = field(default_factory=dict)

    @property
    def has_duration(self) -> bool:
        return bool(self.samples_us)

    def to_json(self) -> dict[str, Any]:
        # by hand rather than dataclasses.asdict, whose deep copy costs ~0.15 ms per result
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["ref"] = self.ref.to_json()
        data["samples_us"] = list(self.samples_us)
        data["kernels"] = [
            {"name": k.name, "mean_us": k.mean_us, "calls_per_repeat": k.calls_per_repeat} for k in self.kernels
        ]
        data["counters"] = dict(self.counters)
        data["identity"] = dict(self.identity)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseResult:
        values = dict(data)
        values["ref"] = CaseRef.from_json(values["ref"])
        values["samples_us"] = Samples(values.get("samples_us", ()))
        # every case of a kernel type launches the same kernels (CUDA names run to 200 characters)
        values["kernels"] = tuple(
            KernelTime(sys.intern(k["name"]), k["mean_us"], k["calls_per_repeat"]) for k in values.get("kernels", ())
        )
        for name in ("outcome", "backend"):
            if isinstance(values.get(name), str):
                values[name] = sys.intern(values[name])
        return cls(**values)


@dataclass(frozen=True)
class SampleStats:
    """Statistics of the steady-state samples written back to a row.

    ``mean`` is what ``Average Duration(us)`` holds: the arithmetic mean of the per-repeat
    durations after warm-up (the same statistic as ``Profiling Average Duration(us)``, so the two
    compare like for like); median, min, std (population) and count go in the added columns,
    as ``perf_plugin.database.schema.MICROBENCH_STATISTICS`` maps them.
    """

    mean: float
    median: float
    minimum: float
    std: float
    count: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> SampleStats:
        values = list(samples)
        if not values:
            raise ValueError("no samples")
        mean = statistics.fmean(values)
        # A compensated float sum rather than statistics.pstdev, which sums in exact fractions
        # (~0.1 ms per case: seconds over a large run); it agrees far below the 3 decimals kept.
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values)) if len(values) > 1 else 0.0
        return cls(mean=mean, median=statistics.median(values), minimum=min(values), std=std, count=len(values))

    def value(self, statistic: str) -> float:
        """One statistic by its name in ``perf_plugin.database.schema.MICROBENCH_STATISTICS``."""
        values = {"mean": self.mean, "median": self.median, "minimum": self.minimum, "std": self.std}
        if statistic == "count":
            return float(self.count)
        if statistic not in values:
            raise ValueError(f"unknown statistic {statistic!r}")
        return values[statistic]


@dataclass(frozen=True)
class QuarantinedRow:
    """A database row that could not become a replay case, and why.

    The ref's signature guards against the file having changed since collection.
    """

    ref: CaseRef
    reason: str


@dataclass
class FileWriteback:
    """What write-back did to one CSV file."""

    csv_file: str
    rows_updated: int = 0
    rows_appended: int = 0
    rows_pruned: int = 0
    rows_quarantined: int = 0
    unmatched_samples: list[str] = field(default_factory=list)  # case ids with no matching row
    written: bool = False


@dataclass(slots=True)  # one per measured row, held until the reports are written
class GapRow:
    """Microbench vs profiling duration of one row, for the gap report, and the kernels each
    side launched where both were recorded on one kind of device (``Profiling Kernels`` and
    ``MicroBench Kernels``; empty otherwise)."""

    csv_file: str
    row_line: int | None
    signature_key: str
    microbench_us: float | None
    profiling_us: float | None
    profiled_kernels: str = ""
    replayed_kernels: str = ""

    @property
    def kernel_difference(self) -> KernelDifference | None:
        """The kernels only one side launched (None: the same, or nothing to compare)."""
        return kernel_difference(self.profiled_kernels, self.replayed_kernels)

    @property
    def ratio(self) -> float | None:
        if self.microbench_us is None or not self.profiling_us:
            return None
        return self.microbench_us / self.profiling_us

    @property
    def flagged(self) -> bool:
        ratio = self.ratio
        return ratio is not None and not (0.8 <= ratio <= 1.2)


@dataclass
class RunSummary:
    """Everything the reports need about one `pytest bench` run (built on the controller)."""

    started_at: str  # ISO 8601, UTC
    elapsed_s: float
    backend: str
    device_name: str
    database_dir: str
    update_mode: str
    repeat_count: int
    warmup_count: int
    command: list[str]
    cache_mode: str = "warm"
    repeat_markers: bool = False  # CUDA: a marker kernel before every repeat instead of one per case
    results: list[CaseResult] = field(default_factory=list)
    files: list[FileWriteback] = field(default_factory=list)
    quarantined: list[QuarantinedRow] = field(default_factory=list)
    gaps: list[GapRow] = field(default_factory=list)
    device_ids: list[int] = field(default_factory=list)
    max_concurrency: int = 1
    env: dict[str, Any] = field(default_factory=dict)
    coverage_min: float | None = None
    coverage: float | None = None  # share of the selected rows that replayed and passed
    coverage_time: float | None = None  # the same, weighed by the rows' profiled time
    interrupted: str | None = None  # an interrupted run: what it measured, wrote and left
