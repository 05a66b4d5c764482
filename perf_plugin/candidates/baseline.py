"""``baseline_time.json``: the reference replay's times per row and device, in KernelBench's manner.

KernelBench times every reference problem once per hardware (``generate_baseline_time.py``) and
keeps ``{hardware: {level: {problem: {mean, std, min, max, num_trials, hardware, device}}}}`` in
milliseconds, so that generated kernels are judged later without timing the references again.
Here the level is the kernel type and the problem is the row's case id:

    {"<device>": {"<kernel type>": {"<case id>": {"mean": ms, "std": ms, "min": ms, "max": ms,
      "num_trials": n, "hardware": "<device name>", "device": "<backend>",
      "csv_file": "...", "row_line": n, "signature": "..."}}}}

``signature`` is the row's signature key: an entry whose row changed is not used.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf_plugin.database.atomic import atomic_write_text
from perf_plugin.results import CaseRef

BASELINE_FILE = "baseline_time.json"


class BaselineError(Exception):
    """A baseline file that cannot be read: the message names the file and the entry."""


@dataclass(frozen=True)
class BaselineEntry:
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    num_trials: int
    hardware: str
    device: str
    csv_file: str
    row_line: int | None
    signature: str

    @property
    def mean_us(self) -> float:
        return self.mean_ms * 1000.0

    def to_json(self) -> dict[str, Any]:
        return {
            "mean": self.mean_ms,
            "std": self.std_ms,
            "min": self.min_ms,
            "max": self.max_ms,
            "num_trials": self.num_trials,
            "hardware": self.hardware,
            "device": self.device,
            "csv_file": self.csv_file,
            "row_line": self.row_line,
            "signature": self.signature,
        }


def entry_from_samples(ref: CaseRef, samples_us: Sequence[float], hardware: str, device: str) -> BaselineEntry:
    ms = [s / 1000.0 for s in samples_us]
    return BaselineEntry(
        statistics.fmean(ms),
        statistics.stdev(ms) if len(ms) > 1 else 0.0,
        min(ms),
        max(ms),
        len(ms),
        hardware,
        device,
        ref.csv_file,
        ref.row_line,
        ref.signature_key,
    )


def _entry(path: Path, where: str, data: Any) -> BaselineEntry:
    if not isinstance(data, dict):
        raise BaselineError(f"{path}: {where} is not an object")
    try:
        mean = float(data["mean"])
        line = data.get("row_line")
        entry = BaselineEntry(
            mean,
            float(data.get("std", 0.0)),
            float(data.get("min", mean)),
            float(data.get("max", mean)),
            int(data.get("num_trials", 0)),
            str(data.get("hardware", "")),
            str(data.get("device", "")),
            str(data.get("csv_file", "")),
            None if line is None else int(line),
            str(data.get("signature", "")),
        )
    except KeyError as exc:
        raise BaselineError(f"{path}: {where} has no {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise BaselineError(f"{path}: {where}: {exc}") from None
    if not (math.isfinite(entry.mean_ms) and entry.mean_ms > 0):
        raise BaselineError(f"{path}: {where}: mean {data['mean']!r} is not a positive time")
    return entry


def read_baseline(path: str | Path) -> dict[str, dict[str, dict[str, BaselineEntry]]]:
    """device -> kernel type -> case id -> entry; an absent file is an empty baseline."""
    file = Path(path)
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BaselineError(f"{file}: not a readable JSON file: {exc}") from None
    if not isinstance(data, dict):
        raise BaselineError(f"{file}: the top level is not an object of devices")
    baseline: dict[str, dict[str, dict[str, BaselineEntry]]] = {}
    for device, types in data.items():
        if not isinstance(types, dict):
            raise BaselineError(f"{file}: device {device!r} is not an object of kernel types")
        for kernel_type, rows in types.items():
            if not isinstance(rows, dict):
                raise BaselineError(f"{file}: {device!r} / {kernel_type!r} is not an object of rows")
            for case_id, entry in rows.items():
                where = f"{device!r} / {kernel_type!r} / {case_id!r}"
                baseline.setdefault(device, {}).setdefault(kernel_type, {})[case_id] = _entry(file, where, entry)
    return baseline


def lookup(
    baseline: dict[str, dict[str, dict[str, BaselineEntry]]], device: str, ref: CaseRef
) -> BaselineEntry | None:
    """The row's entry for this device, if its row is still the same (signature)."""
    entry = baseline.get(device, {}).get(ref.kernel_type, {}).get(ref.case_id)
    if entry is None or (entry.signature and entry.signature != ref.signature_key):
        return None
    return entry


def write_baseline(path: str | Path, baseline: dict[str, dict[str, dict[str, BaselineEntry]]]) -> Path:
    data = {
        device: {kt: {cid: e.to_json() for cid, e in sorted(rows.items())} for kt, rows in sorted(types.items())}
        for device, types in sorted(baseline.items())
    }
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(file, json.dumps(data, indent=2) + "\n")
    return file
