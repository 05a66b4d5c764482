"""One measured collective case and the CSV cells it becomes.

Columns, contract first: ``message_bytes, num_devices, dtype, topology_tier, Duration(us),
bandwidth_gbps``, then the added ``bus_bandwidth_gbps, Median Duration(us), iterations, mode,
backend, world_size, timestamp, nccl_tests_bytes``.

The contract columns mean what they mean in the Ascend HCCL microbenchmark's files, which the
Ascend performance model reads: ``message_bytes`` is the size the model computes from the tensor
at the call (see ``collectives``: all_gather one rank's input, reduce_scatter one rank's output),
``dtype`` is spelled ``DT_BF16, DT_FP16, DT_FLOAT, DT_INT8``.  ``nccl_tests_bytes`` states the
same case in nccl-tests' size (``message_bytes`` x the group size for all_gather and
reduce_scatter, equal otherwise), which bus bandwidth is computed from.

Statistic: for each timed iteration the duration is the maximum over all ranks (a collective
is done when its slowest rank is done); ``Duration(us)`` is the mean of those per-iteration
maxima and ``Median Duration(us)`` their median.  nccl-tests instead times its whole loop on each
rank and, by default (``-a 1``), averages the per-rank means; with back-to-back iterations the
ranks finish together, so the two agree closely.

Bandwidths are decimal GB/s (1e9 bytes per second), as nccl-tests reports them:
``bandwidth_gbps`` = message_bytes / Duration (as the Ascend microbenchmark computes it; nccl-tests'
algorithm bandwidth for all_reduce and all_to_all) and ``bus_bandwidth_gbps`` = nccl_tests_bytes /
Duration x the op's bus factor (nccl-tests' ``busbw``).  Both are computed from the written
``Duration(us)`` cell, so anyone can recompute them from the row (to the digits written).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime, timezone

from perf_plugin.comm.plan import CommCase
from perf_plugin.database.schema import format_number

MESSAGE_BYTES = "message_bytes"
NUM_DEVICES = "num_devices"
DTYPE = "dtype"
TOPOLOGY_TIER = "topology_tier"
DURATION = "Duration(us)"
BANDWIDTH = "bandwidth_gbps"
BUS_BANDWIDTH = "bus_bandwidth_gbps"
MEDIAN_DURATION = "Median Duration(us)"
ITERATIONS = "iterations"
MODE = "mode"
BACKEND = "backend"
WORLD_SIZE = "world_size"
TIMESTAMP = "timestamp"
# Last, so files written before it and files upgraded by ``perfdb upgrade-comm`` (which appends
# it) have the same column order as new ones.
NCCL_TESTS_BYTES = "nccl_tests_bytes"
CONTRACT_COLUMNS = (MESSAGE_BYTES, NUM_DEVICES, DTYPE, TOPOLOGY_TIER, DURATION, BANDWIDTH)
ADDED_COLUMNS = (BUS_BANDWIDTH, MEDIAN_DURATION, ITERATIONS, MODE, BACKEND, WORLD_SIZE, TIMESTAMP, NCCL_TESTS_BYTES)
COLUMNS = CONTRACT_COLUMNS + ADDED_COLUMNS
# A row is identified by these: a new measurement replaces the row with the same key.
KEY_COLUMNS = (MESSAGE_BYTES, NUM_DEVICES, DTYPE, TOPOLOGY_TIER, MODE)
DURATION_DIGITS = 3  # nanoseconds
BANDWIDTH_DIGITS = 6


def algorithm_bandwidth(message_bytes: int, duration_us: float) -> float:
    """GB/s (1e9 bytes/s) of ``message_bytes`` moved in ``duration_us``."""
    if duration_us <= 0:
        raise ValueError(f"duration {duration_us} us is not positive")
    return message_bytes / (duration_us * 1e3)


def bandwidth_cell(message_bytes: int, duration_us: float) -> str:
    """``bandwidth_gbps`` as written: ``message_bytes`` over the written duration."""
    return format_number(algorithm_bandwidth(message_bytes, duration_us), BANDWIDTH_DIGITS)


def utc_timestamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class CommResult:
    case: CommCase
    samples_us: tuple[float, ...]  # per-iteration maximum over ranks
    mode: str
    ccl: str
    world_size: int
    timestamp: str

    def __post_init__(self) -> None:
        if not self.samples_us or min(self.samples_us) <= 0:
            raise ValueError(f"{self.case.id}: durations must be positive, got {self.samples_us!r}")

    @property
    def mean_us(self) -> float:
        return statistics.fmean(self.samples_us)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    @property
    def message_bytes(self) -> int:
        """The size the Ascend performance model reads (the case counts in nccl-tests' size)."""
        return self.case.op.message_bytes(self.case.message_bytes, self.case.num_devices)

    def cells(self) -> dict[str, str]:
        duration = format_number(self.mean_us, DURATION_DIGITS)
        # a sub-nanosecond mean would print as 0: keep the smallest positive value instead
        written_us = float(duration) or 10.0**-DURATION_DIGITS
        duration = format_number(written_us, DURATION_DIGITS)
        nccl_tests_bytes, n = self.case.message_bytes, self.case.num_devices
        bus = algorithm_bandwidth(nccl_tests_bytes, written_us) * self.case.op.bus_factor(n)
        return {
            MESSAGE_BYTES: str(self.message_bytes),
            NUM_DEVICES: str(self.case.num_devices),
            DTYPE: self.case.dtype.db_name,
            TOPOLOGY_TIER: str(self.case.topology_tier),
            DURATION: duration,
            BANDWIDTH: bandwidth_cell(self.message_bytes, written_us),
            BUS_BANDWIDTH: format_number(bus, BANDWIDTH_DIGITS),
            MEDIAN_DURATION: format_number(self.median_us, DURATION_DIGITS),
            ITERATIONS: str(len(self.samples_us)),
            MODE: self.mode,
            BACKEND: self.ccl,
            WORLD_SIZE: str(self.world_size),
            TIMESTAMP: self.timestamp,
            NCCL_TESTS_BYTES: str(nccl_tests_bytes),
        }
