"""The file an input-value capture writes beside a profile, and the names of its annotations.

A capture (``perf_plugin.capture``) wraps every call it watches in a profiler range named
``perf_values/<token>/<n>`` and records the values of that call's small integer tensor
arguments.  The profile then holds the ranges, and this file, written when the capture ends,
holds the values under the same ``<n>``::

    {"format": "perf-plugin input values", "version": 1, "token": "3f9c...",
     "calls": {"0": {"function": "torch._grouped_mm", "values": {"2": [128, 256, ...]}},
               "1": {"function": "torch.topk", "values": {}, "quantiles": {"0": [0.11, ...]},
                     "depths": {"0": {"10": 480, "32": 2}}},
               "2": {"function": "torch.Tensor.div", "values": {}, "zeros": {"0": 0.0626, "1": 0.0}},
               "3": {"function": "torch.nn.functional.softmax", "values": {}, "masked": {"0": [0.498, 0.998]}}}}

``values`` maps the argument's position in the traced operator's inputs (its schema's order:
``group_list`` is 8 of ``npu::npu_grouped_matmul``) to its values, flattened.  ``quantiles`` (a
floating input whose values, not only its size, set the kernel's time: top-k's
input) maps the position to ``QUANTILES`` quantiles of its values, the least first and the
greatest last; ``depths`` (top-k's input) maps it to how many of the input's rows selected their
k-th value at each selection depth (``perf_plugin.capture.selection_depth``); ``zeros`` (a
division's floating operands) maps it to the share of the input's elements that were zero;
``masked`` (a softmax's input) maps it to the share of the elements read that were masked and the
mean number of runs of masked elements per row read (``perf_plugin.capture.masked_rows``);
``distinct`` (a gather's integer index) maps it to the share of the index's values that were distinct.  A
file without any of these keys is read as having none.  The token tells one
capture's ranges from another's (a trace may hold several runs).  The file sits beside the trace
as ``<trace name>.values.json`` (``trace.json`` -> ``trace.values.json``), where ``perfdb ingest``
finds it (``worker.pt.trace.json`` -> ``worker.values.json``); for an Ascend profile, whose
directory torch_npu names after the run, any ``*.values.json`` in or beside the profile directory
whose token the profile's ranges carry (``perf_plugin.ingest.ascend_values``).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perf_plugin.database.errors import DatabaseError

FORMAT = "perf-plugin input values"
VERSION = 1
MARK_PREFIX = "perf_values/"
SUFFIX = ".values.json"
# The execution trace beside a trace (perf_plugin.ingest.execution_trace): ``run.json`` -> ``run.et.json``.
EXECUTION_TRACE_SUFFIX = ".et.json"


# Quantiles recorded per floating input: every sixteenth of its sorted values, both ends included.
QUANTILES = 17


@dataclass(frozen=True)
class CapturedCall:
    function: str
    values: dict[int, tuple[int, ...]]  # argument position -> flattened values
    quantiles: dict[int, tuple[float, ...]] = field(default_factory=dict)  # argument position -> QUANTILES
    depths: dict[int, dict[int, int]] = field(default_factory=dict)  # argument position -> depth -> rows
    zeros: dict[int, float] = field(default_factory=dict)  # argument position -> share of zero elements
    # argument position -> (share of masked elements, mean runs of them per row)
    masked: dict[int, tuple[float, float]] = field(default_factory=dict)
    distinct: dict[int, float] = field(default_factory=dict)  # argument position -> share of distinct values


@dataclass
class CapturedValues:
    token: str
    calls: dict[str, CapturedCall] = field(default_factory=dict)
    source: Path | None = None


def mark_name(token: str, key: int | str) -> str:
    return f"{MARK_PREFIX}{token}/{key}"


def parse_mark(name: str) -> tuple[str, str] | None:
    """(token, key) of a capture's range name, None for any other name."""
    if not name.startswith(MARK_PREFIX):
        return None
    token, _, key = name[len(MARK_PREFIX):].partition("/")
    return (token, key) if token and key else None


def sidecar_path(trace: str | Path, suffix: str = SUFFIX) -> Path:
    """Where the values of ``trace`` are looked for: ``run.json`` / ``run.json.gz`` -> ``run.values.json``
    (another file beside the trace with another ``suffix``: ``run.et.json``)."""
    trace = Path(trace)
    name = trace.name
    for ending in (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json"):
        if name.endswith(ending):
            name = name[: -len(ending)]
            break
    return trace.with_name(name + suffix)


def write_values_file(path: str | Path, captured: CapturedValues) -> Path:
    """Write ``captured`` atomically (a reader never sees half a file)."""
    path = Path(path)
    document = {
        "format": FORMAT,
        "version": VERSION,
        "token": captured.token,
        "calls": {key: _entry(call) for key, call in captured.calls.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(prefix=path.name, dir=path.parent)
    with os.fdopen(handle, "w") as out:
        json.dump(document, out, separators=(",", ":"))
    os.replace(scratch, path)
    return path


def _entry(call: CapturedCall) -> dict[str, Any]:
    entry: dict[str, Any] = {"function": call.function, "values": {str(arg): list(v) for arg, v in call.values.items()}}
    if call.quantiles:
        entry["quantiles"] = {str(arg): list(q) for arg, q in call.quantiles.items()}
    if call.depths:
        entry["depths"] = {str(arg): {str(d): n for d, n in h.items()} for arg, h in call.depths.items()}
    if call.zeros:
        entry["zeros"] = {str(arg): share for arg, share in call.zeros.items()}
    if call.masked:
        entry["masked"] = {str(arg): [share, runs] for arg, (share, runs) in call.masked.items()}
    if call.distinct:
        entry["distinct"] = {str(arg): share for arg, share in call.distinct.items()}
    return entry


def read_values_file(path: str | Path) -> CapturedValues:
    """The file's calls; a file that is not one says so, naming the file and the entry."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DatabaseError(f"cannot read the input values file: {exc}", path=path) from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise DatabaseError(f"not an input values file (no \"format\": \"{FORMAT}\")", path=path)
    if document.get("version") != VERSION:
        raise DatabaseError(f"input values file version {document.get('version')!r}; this reader knows {VERSION}",
                            path=path)
    calls = document.get("calls")
    if not isinstance(calls, dict):
        raise DatabaseError("the input values file has no \"calls\" object", path=path)
    captured = CapturedValues(str(document.get("token", "")), source=path)
    for key, entry in calls.items():
        captured.calls[str(key)] = _call(entry, path, key)
    return captured


def _call(entry: Any, path: Path, key: str) -> CapturedCall:
    try:
        function = str(entry["function"])
        values = {int(arg): tuple(int(v) for v in found) for arg, found in entry["values"].items()}
        quantiles = {int(arg): tuple(float(q) for q in found) for arg, found in entry.get("quantiles", {}).items()}
        depths = {int(arg): {int(d): int(n) for d, n in found.items()}
                  for arg, found in entry.get("depths", {}).items()}
        zeros = {int(arg): float(share) for arg, share in entry.get("zeros", {}).items()}
        masked = {int(arg): (float(share), float(runs)) for arg, (share, runs) in entry.get("masked", {}).items()}
        distinct = {int(arg): float(share) for arg, share in entry.get("distinct", {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise DatabaseError(f"call {key!r}: expected {{\"function\": name, \"values\": {{argument: [integers]}}}}"
                            " (and optionally \"quantiles\": {argument: [numbers]},"
                            " \"depths\": {argument: {depth: rows}}, \"zeros\": {argument: share},"
                            " \"masked\": {argument: [share, runs per row]}, \"distinct\": {argument: share})",
                            path=path) from None
    # infinities are values a model gives top-k (scores masked to -inf): only NaN is refused
    if any(len(q) != QUANTILES or any(math.isnan(v) for v in q) or list(q) != sorted(q) for q in quantiles.values()):
        raise DatabaseError(f"call {key!r}: quantiles must be {QUANTILES} numbers (not NaN) in ascending order",
                            path=path)
    if any(d < 0 or n < 1 for h in depths.values() for d, n in h.items()):
        raise DatabaseError(f"call {key!r}: depths must map depths (0 or more) to row counts (1 or more)", path=path)
    if any(not 0.0 <= share <= 1.0 for share in zeros.values()):
        raise DatabaseError(f"call {key!r}: zero shares must be numbers between 0 and 1", path=path)
    if any(not 0.0 < share <= 1.0 for share in distinct.values()):
        raise DatabaseError(f"call {key!r}: distinct shares must be numbers above 0, at most 1", path=path)
    if any(not 0.0 <= share <= 1.0 or not runs >= 0.0 for share, runs in masked.values()):
        raise DatabaseError(f"call {key!r}: masked must map an argument to a share between 0 and 1 and"
                            " runs per row (0 or more)", path=path)
    return CapturedCall(function, values, quantiles, depths, zeros, masked, distinct)
