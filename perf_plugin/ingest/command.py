"""``perfdb ingest``: profiler output -> per-kernel CSVs of a database directory.

The successor of the origin tool chain's ``parse_kernel_details.py``, with its option names.
The output directory is ``--database-path`` when given, else the directory contract's path
derived from ``--database-root``, ``--device`` and the version options (printed, so the user
sees where the rows went):

* Ascend profiles (kernel_details / op_summary): ``{root}/{device}/vllm_ascend/
  vllm{V}_torch{T}_cann{C}``; ``--device`` defaults to ATLAS_800_A3_752T_128G_DIE;
* PyTorch traces: ``{root}/{device}/{vllm|torch}/[vllm{V}_]torch{T}[_cuda{C}]``; ``--device``
  defaults to the GPU name the trace records (``NVIDIA H100 80GB HBM3`` ->
  ``NVIDIA_H100_80GB_HBM3``), or ``CPU_<machine>`` for a CPU trace (the machine running
  ingest: a CPU trace does not record the host's architecture).
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

from perf_plugin.database import paths
from perf_plugin.database.errors import DatabaseError
from perf_plugin.ingest import discover as disc
from perf_plugin.ingest.merge import merge_into_database
from perf_plugin.ingest.pipeline import IngestReport, ingest_path
from perf_plugin.usage import UsageError

DEFAULT_ROOT = Path(*paths.DEFAULT_ROOT_PARTS)


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "ingest",
        help="turn profiler output into per-kernel database CSVs",
        description=(
            "Aggregate a kernel_details*.csv / op_summary_*.csv file, a profiling directory, or a "
            "PyTorch profiler trace (export_chrome_trace, record_shapes=True) into one CSV per kernel "
            "type, merging with the rows already in the database."
        ),
    )
    parser.add_argument(
        "--profiling-path",
        required=True,
        type=Path,
        help="kernel_details*.csv, op_summary_*.csv, a *.json trace, or a directory scanned recursively",
    )
    parser.add_argument("--database-path", type=Path, help="output database directory (wins over the derived path)")
    parser.add_argument(
        "--database-root", type=Path, default=DEFAULT_ROOT, help=f"root of derived paths (default: {DEFAULT_ROOT})"
    )
    parser.add_argument(
        "--device",
        help=f"device directory name (default: {paths.DEFAULT_ASCEND_DEVICE} for Ascend profiles, "
        "the traced GPU's name for CUDA traces, CPU_<machine> for CPU traces)",
    )
    parser.add_argument("--vllm-version", help="vLLM(-Ascend) version of the derived path, e.g. 0.18.0")
    parser.add_argument("--torch-version", help="PyTorch version of the derived path, e.g. 2.9.0")
    parser.add_argument("--cann-version", help="CANN version of the derived path (Ascend), e.g. 8.5")
    parser.add_argument("--cuda-version", help="CUDA version of the derived path (CUDA traces), e.g. 13.0")
    parser.add_argument(
        "--input-values",
        type=Path,
        help="the values file an input-value capture wrote for the trace or Ascend profile (default: "
        "<trace>.values.json beside a trace; *.values.json in or beside an Ascend profile directory)",
    )
    parser.add_argument(
        "--execution-trace",
        type=Path,
        help="the execution trace PyTorch's ExecutionTraceObserver wrote for the trace, naming each input's "
        "tensor (default: <trace>.et.json beside the trace; none: each input's writer inferred from shapes)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="read and aggregate, print the report, write nothing"
    )
    parser.set_defaults(func=run)


def _derive(args: argparse.Namespace, kind: str, device_name: str | None) -> paths.DatabaseLocation:
    if kind == disc.TORCH_TRACE:
        if not args.torch_version:
            raise UsageError("give --database-path, or --torch-version (and --cuda-version for a CUDA trace)")
        if args.device:
            device = args.device
        elif device_name:
            device = paths.sanitise_device_name(device_name)
        else:
            device = "CPU_" + paths.sanitise_device_name(platform.machine() or "UNKNOWN").upper()
        if args.cuda_version:
            version_dir = paths.cuda_version_dir(args.torch_version, args.cuda_version, args.vllm_version)
        else:
            version_dir = paths.cpu_version_dir(args.torch_version, args.vllm_version)
        stack = "vllm" if args.vllm_version else "torch"
        return paths.derive_location(args.database_root, device, stack, version_dir)
    missing = [
        option
        for option, value in (
            ("--vllm-version", args.vllm_version),
            ("--torch-version", args.torch_version),
            ("--cann-version", args.cann_version),
        )
        if not value
    ]
    if missing:
        raise UsageError(f"give --database-path, or {', '.join(missing)} to derive it")
    return paths.derive_location(
        args.database_root,
        args.device or paths.DEFAULT_ASCEND_DEVICE,
        paths.ASCEND_STACK,
        paths.ascend_version_dir(args.vllm_version, args.torch_version, args.cann_version),
    )


def run(args: argparse.Namespace) -> int:
    # Read first: a mistake in the profile is reported before any path is derived or created.
    report: IngestReport = ingest_path(args.profiling_path, None, args.input_values, args.execution_trace)
    if not report.rows:
        left_out = sum(report.communication.values())
        raise DatabaseError(
            f"no compute kernels to ingest ({report.table.rows_read} rows read, {left_out} communication)",
            path=args.profiling_path,
        )
    if args.database_path is not None:
        location = paths.explicit_location(args.database_path)
    else:
        device_name = next((t.device_name for t in report.traces if t.device_name), None)
        location = _derive(args, report.discovery.kind if report.discovery else "", device_name)
        print(f"database path (derived): {location.directory}")
    if not args.dry_run:
        report.merge = merge_into_database(location.directory, report.rows)
    for line in report.lines():
        print(line)
    return 0
