"""``perfdb peaks``: measure this device's peaks once and write them beside the database.

    perfdb peaks --database-path DIR [--backend auto|cpu|cuda|npu] [--sizes 4096,8192] [--copy-mib 1024]

The file (``device_peaks.yaml``) is what ``perfdb lookup`` rescales measured rows by and answers
from when no row is near enough (a ``roofline`` answer); a lookup finds it in the database
directory or in one of its parents, so writing it in the device's directory serves every stack.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perf_plugin.lookup.peaks import PEAKS_FILE, write_peaks
from perf_plugin.usage import UsageError


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser("peaks", help="measure this device's GEMM and copy peaks for lookup's roofline",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-path", type=Path, required=True,
                        help=f"where {PEAKS_FILE} goes (a database directory, or the device's directory above it)")
    parser.add_argument("--backend", default="auto", help="auto (an NPU, then CUDA, then the CPU), cpu, cuda or npu")
    parser.add_argument("--device-index", type=int, default=0)
    parser.add_argument("--sizes", default="", help="GEMM edges, comma-separated (default: 4096,8192; "
                                                    "on the CPU 512,1024)")
    parser.add_argument("--copy-mib", type=int, default=0, help="the copy's size (default 1024; on the CPU 256)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from perf_plugin.backends.select import resolve_backend
    from perf_plugin.lookup.peaks_measure import measure_peaks

    try:
        backend = resolve_backend(args.backend, args.device_index)
    except (ValueError, RuntimeError) as exc:
        raise UsageError(str(exc)) from None
    on_cpu = backend.name == "cpu"
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()] or ([512, 1024] if on_cpu else [4096, 8192])
    except ValueError:
        raise UsageError(f"--sizes takes comma-separated integers, got {args.sizes!r}") from None
    if min(sizes) <= 0 or args.repeats <= 0 or args.copy_mib < 0:
        raise UsageError("--sizes, --repeats and --copy-mib must be positive")
    peaks = measure_peaks(backend, sizes, args.copy_mib or (256 if on_cpu else 1024), args.repeats)
    args.database_path.mkdir(parents=True, exist_ok=True)
    path = args.database_path / PEAKS_FILE
    write_peaks(path, peaks)
    rates = ", ".join(f"{dtype} {tflops:.4g}" for dtype, tflops in peaks.matmul_tflops.items())
    print(f"{peaks.device}: GEMM TFLOP/s {rates}; copy {peaks.copy_gbps:.4g} GB/s -> {path}")
    return 0
