"""A device's measured peaks, the roofline a lookup rescales by: ``device_peaks.yaml``.

``perfdb peaks`` measures them once per device (``peaks_measure.py``: a large GEMM per dtype, a
large copy) and writes them beside the database.  A lookup reads the nearest such file: in the
database directory, else in one of its parents (a database root holds one directory per device,
then one per software stack, so a file in the device's directory serves every stack).

    device: NVIDIA H100 80GB HBM3
    backend: cuda
    matmul_tflops: {BF16: 702.4, FLOAT16: 710.0, FLOAT: 51.2, FLOAT8_E4M3FN: 1251.0}
    copy_gbps: 2963.0
    multiprocessors: 132   # where the backend tells (a GPU's SMs): a tiled kernel's waves
    last_level_cache_bytes: 52428800   # where the backend tells: which inputs the replay kept cached
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from perf_plugin.database.atomic import atomic_write_text
from perf_plugin.database.errors import DatabaseError

PEAKS_FILE = "device_peaks.yaml"
MULTIPROCESSORS = "multiprocessors"  # a key of the file's details: how many units a kernel's tiles spread over
# a key of the file's details: the replay's ``rotate`` keeps inputs cached by this size (lookup/cache_state.py)
CACHE_BYTES = "last_level_cache_bytes"
# database dir, device dir, ... : how far up a lookup looks (root / device / vllm / torch / cann)
_LEVELS = 5


@dataclass(frozen=True)
class DevicePeaks:
    device: str
    backend: str
    matmul_tflops: Mapping[str, float]  # by dtype as rows write them (BF16, FLOAT8_E4M3FN ...)
    copy_gbps: float  # bytes read plus bytes written per second, in 1e9
    details: Mapping[str, Any] = field(default_factory=dict)  # what was run, when, with which torch
    path: Path | None = None

    def compute_us(self, flops: float, dtype: str) -> float | None:
        """The time of ``flops`` at the dtype's peak; None when no peak was measured for it."""
        peak = self.matmul_tflops.get(dtype)
        return None if not peak else flops / (peak * 1e6)

    def memory_us(self, nbytes: float) -> float:
        return nbytes / (self.copy_gbps * 1e3)

    @property
    def compute_units(self) -> int | None:
        """The device's multiprocessors, where ``perfdb peaks`` recorded them (files written
        before it did have none)."""
        return _positive_int(self.details.get(MULTIPROCESSORS))

    @property
    def cache_bytes(self) -> int | None:
        """The device's last-level cache, where ``perfdb peaks`` recorded it (files written
        before it did have none)."""
        return _positive_int(self.details.get(CACHE_BYTES))


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def write_peaks(path: Path, peaks: DevicePeaks) -> None:
    document = {
        "device": peaks.device, "backend": peaks.backend,
        "matmul_tflops": {k: _digits(v) for k, v in peaks.matmul_tflops.items()},
        "copy_gbps": _digits(peaks.copy_gbps), **dict(peaks.details),
    }
    header = "# Device peaks measured by `perfdb peaks`: the roofline `perfdb lookup` rescales measured rows by.\n"
    atomic_write_text(path, header + yaml.safe_dump(document, sort_keys=False))


def _digits(value: float) -> float:
    return float(f"{value:.5g}")  # a CPU's FP16 GEMM reaches a thousandth of a TFLOP/s


def read_peaks(path: Path) -> DevicePeaks:
    """The peaks file at ``path``, parsed once per version of the file (a CSV of queries asks for
    it once per query)."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise DatabaseError(f"cannot read: {exc}", path=path) from None
    return _read_peaks(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_peaks(path: Path, mtime_ns: int, size: int) -> DevicePeaks:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DatabaseError(f"cannot read: {exc}", path=path) from None
    if not isinstance(document, dict):
        raise DatabaseError("is not a mapping of device peaks", path=path)
    try:
        matmul = {str(k): float(v) for k, v in (document.get("matmul_tflops") or {}).items()}
        copy = float(document["copy_gbps"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DatabaseError(f"needs matmul_tflops (dtype: TFLOP/s) and copy_gbps (a number): {exc}",
                            path=path) from None
    if copy <= 0 or any(v <= 0 for v in matmul.values()):
        raise DatabaseError("peaks must be positive", path=path)
    details = {k: v for k, v in document.items() if k not in ("device", "backend", "matmul_tflops", "copy_gbps")}
    return DevicePeaks(str(document.get("device", "")), str(document.get("backend", "")), matmul, copy, details, path)


def find_peaks(database: Path) -> DevicePeaks | None:
    """The peaks file nearest to ``database`` (itself, then its parents); None if there is none."""
    here = database.resolve()
    for directory in [here, *here.parents][:_LEVELS]:
        candidate = directory / PEAKS_FILE
        if candidate.is_file():
            return read_peaks(candidate)
    return None
