"""Find the profiler output under ``--profiling-path``.

A file is taken as what its name or header says: ``kernel_details*.csv``, ``op_summary_*.csv``,
a Chrome trace (``*.json`` / ``*.json.gz`` with ``traceEvents``).  A directory is scanned
recursively, in this order of preference (one profile is never counted twice):

1. files whose name contains ``kernel_details`` (torch_npu's ``ASCEND_PROFILER_OUTPUT``);
2. msprof ``op_summary_*.csv`` (``op_summary_slice_N_*.csv`` included) under
   ``mindstudio_profiler_output/``, else under ``device_*/summary/`` (the older layout);
   a torch_npu output directory holds both kernel_details and a ``PROF_*`` tree with the same
   kernels, so op_summary files are used only when there is no kernel_details;
3. PyTorch profiler traces: ``*.pt.trace.json[.gz]`` (``tensorboard_trace_handler``) and
   other ``*trace*.json[.gz]`` files, except Ascend's ``trace_view.json``.

Beside each kernel_details file, ``operator_details.csv`` and ``trace_view.json`` are looked
for and reported: the FIA bundle check (``perf_plugin.ingest.fia_bundle``) takes the operator
shapes of FusedInferAttentionScore kernels from them.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from perf_plugin.database.errors import DatabaseError
from perf_plugin.trace.values_file import EXECUTION_TRACE_SUFFIX
from perf_plugin.trace.values_file import SUFFIX as VALUES_SUFFIX

KERNEL_DETAILS = "kernel_details"
OP_SUMMARY = "op_summary"
TORCH_TRACE = "torch_trace"

SIDECAR_NAMES: tuple[str, ...] = ("operator_details.csv", "trace_view.json")
ASCEND_TRACE_VIEW = "trace_view.json"


@dataclass
class Discovery:
    kind: str
    files: list[Path]
    sidecars: dict[Path, dict[str, Path | None]] = field(default_factory=dict)
    ignored: list[Path] = field(default_factory=list)


def _is_trace_name(path: Path) -> bool:
    name = path.name.lower()
    # an input-value capture's file (trace.values.json) and an execution trace (trace.et.json)
    # lie beside their trace, and are no traces
    return (name.endswith((".json", ".json.gz")) and name != ASCEND_TRACE_VIEW
            and not name.endswith((VALUES_SUFFIX, EXECUTION_TRACE_SUFFIX)))


def _sniff_csv(path: Path) -> str | None:
    try:
        with path.open("r", encoding="utf-8-sig", newline="") as handle:
            header = next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError):
        return None
    if "OP Type" in header and "Op Name" in header:
        return OP_SUMMARY
    if "Type" in header and "Name" in header:
        return KERNEL_DETAILS
    return None


def classify_file(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".csv"):
        if KERNEL_DETAILS in name:
            return KERNEL_DETAILS
        if name.startswith(OP_SUMMARY):
            return OP_SUMMARY
        sniffed = _sniff_csv(path)
        if sniffed:
            return sniffed
    elif _is_trace_name(path):
        return TORCH_TRACE
    raise DatabaseError(
        "not a profiler file ingest reads (kernel_details*.csv, op_summary_*.csv, or a PyTorch "
        "profiler trace *.json from export_chrome_trace)",
        path=path,
    )


def sidecars_of(kernel_details: Path) -> dict[str, Path | None]:
    found: dict[str, Path | None] = {}
    for name in SIDECAR_NAMES:
        candidate = kernel_details.parent / name
        found[name] = candidate if candidate.is_file() else None
    return found


def find_op_summaries(root: Path) -> list[Path]:
    """msprof op_summary files of a PROF_* tree (or of any directory holding such trees)."""
    if root.is_file():
        return [root]
    exported = sorted(
        p for p in root.rglob("op_summary_*.csv") if p.is_file() and "mindstudio_profiler_output" in p.parts
    )
    if exported:
        return exported
    return sorted(
        p
        for p in root.rglob("op_summary_*.csv")
        if p.is_file() and p.parent.name == "summary" and p.parent.parent.name.startswith("device_")
    )


def discover(path: str | Path) -> Discovery:
    root = Path(path)
    if not root.exists():
        raise DatabaseError("profiling path does not exist", path=root)
    if root.is_file():
        kind = classify_file(root)
        discovery = Discovery(kind, [root])
        if kind == KERNEL_DETAILS:
            discovery.sidecars[root] = sidecars_of(root)
        return discovery

    kernel_details = sorted(
        p for p in root.rglob("*") if p.is_file() and KERNEL_DETAILS in p.name and p.name.lower().endswith(".csv")
    )
    op_summaries = find_op_summaries(root)
    traces = sorted(p for p in root.rglob("*") if p.is_file() and _is_trace_name(p) and "trace" in p.name.lower())
    if kernel_details:
        discovery = Discovery(KERNEL_DETAILS, kernel_details, ignored=op_summaries + traces)
        for file in kernel_details:
            discovery.sidecars[file] = sidecars_of(file)
        return discovery
    if op_summaries:
        return Discovery(OP_SUMMARY, op_summaries, ignored=traces)
    if traces:
        return Discovery(TORCH_TRACE, traces)
    raise DatabaseError(
        "no profiler output found: expected kernel_details*.csv, PROF_*/.../op_summary_*.csv or "
        "PyTorch profiler traces (*.pt.trace.json) under this directory",
        path=root,
    )
