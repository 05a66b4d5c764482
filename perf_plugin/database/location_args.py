"""The database directory of an offline command: given (``--database-path``) or derived.

``perfdb grid`` and ``perfdb lookup`` take a database directory either as it is or as the run
derives it (``<root>/<device>/<stack>/<versions>``, ``perf_plugin.database.paths``), with the
same options and the same messages.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perf_plugin.database.paths import (
    ASCEND_STACK,
    DEFAULT_ASCEND_DEVICE,
    DEFAULT_ROOT_PARTS,
    DatabaseLocation,
    ascend_version_dir,
    cuda_version_dir,
    derive_location,
    explicit_location,
)
from perf_plugin.usage import UsageError

DEFAULT_ROOT = str(Path(*DEFAULT_ROOT_PARTS))  # the same root as ingest's


def add_location_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("database directory")
    where.add_argument("--data-dir", "--database-path", dest="data_dir", metavar="DIR",
                       help="database directory (wins over the derived path)")
    where.add_argument("--database-root", default=DEFAULT_ROOT, metavar="DIR",
                       help="root of derived database paths (default: %(default)s)")
    where.add_argument("--device", default=None,
                       help=f"device directory name (default for Ascend: {DEFAULT_ASCEND_DEVICE})")
    where.add_argument("--vllm-version", help="vLLM(-Ascend) version of the derived path")
    where.add_argument("--torch-version", help="PyTorch version of the derived path")
    where.add_argument("--cann-version", help="CANN version of the derived (Ascend) path")
    where.add_argument("--cuda-version", help="CUDA version of the derived (CUDA) path")


def resolve_location(args: argparse.Namespace) -> DatabaseLocation:
    if args.data_dir:
        return explicit_location(args.data_dir)
    if args.cann_version:
        if not (args.vllm_version and args.torch_version):
            raise UsageError("a derived Ascend path needs --vllm-version, --torch-version and --cann-version")
        version_dir = ascend_version_dir(args.vllm_version, args.torch_version, args.cann_version)
        return derive_location(args.database_root, args.device or DEFAULT_ASCEND_DEVICE, ASCEND_STACK, version_dir)
    if args.cuda_version:
        if not (args.torch_version and args.device):
            raise UsageError("a derived CUDA path needs --device, --torch-version and --cuda-version")
        version_dir = cuda_version_dir(args.torch_version, args.cuda_version, args.vllm_version)
        stack = "vllm" if args.vllm_version else "torch"
        return derive_location(args.database_root, args.device, stack, version_dir)
    raise UsageError("give --data-dir, or --vllm-version, --torch-version and --cann-version to derive the directory")
