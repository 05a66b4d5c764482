"""The database directory contract.

``{root}/{device}/{stack}/{version_dir}/{KernelType}.csv`` for compute kernels and
``{root}/{device}/{ccl}/{ccl_dir}/hcom_{op}_.csv`` for collectives.  Ascend names are fixed
by existing databases: stack ``vllm_ascend``, version directory ``vllm{V}_torch{T}_cann{C}``,
collective directory ``hccl/v{cann}`` (``communication_data_ref: "../../hccl/v8.5/"`` in the
op_mapping.yaml of ``vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5``, which the Ascend performance
model resolves against that directory).  NCCL and gloo keep ``{ccl}/{version}``.  CUDA and CPU
follow the same pattern with stack ``vllm`` (when a vLLM version is given) or ``torch``, and
version directories such as ``torch2.11.0_cuda13.0``.  An explicit database path always wins over
the derived one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.kernel_types import validate_kernel_type

DEFAULT_ASCEND_DEVICE = "ATLAS_800_A3_752T_128G_DIE"
ASCEND_STACK = "vllm_ascend"
DEFAULT_ROOT_PARTS = ("database", "data")
ASCEND_CCL = "hccl"  # the collective directory of Ascend databases

_COMPONENT = re.compile(r"^[A-Za-z0-9_.\-+]+$")


def _component(value: str, what: str) -> str:
    if not value or not _COMPONENT.match(value) or value in {".", ".."}:
        raise DatabaseError(f"{what} {value!r} cannot be a directory name")
    return value


def ascend_version_dir(vllm: str, torch: str, cann: str) -> str:
    return f"vllm{vllm}_torch{torch}_cann{cann}"


def cuda_version_dir(torch: str, cuda: str, vllm: str | None = None) -> str:
    base = f"torch{torch}_cuda{cuda}"
    return f"vllm{vllm}_{base}" if vllm else base


def cpu_version_dir(torch: str, vllm: str | None = None) -> str:
    return f"vllm{vllm}_torch{torch}" if vllm else f"torch{torch}"


def sanitise_device_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'NVIDIA_H100_80GB_HBM3'."""
    cleaned = re.sub(r"[^A-Za-z0-9]+", "_", name.strip()).strip("_")
    return cleaned or "UNKNOWN_DEVICE"


@dataclass(frozen=True)
class DatabaseLocation:
    """Where a compute database lives, and whether the path was derived or given."""

    directory: Path
    derived: bool
    device: str = ""
    stack: str = ""
    version_dir: str = ""
    # Versions of a derived path that no option gave, each with where it was read
    # ("CANN 8.5 from .../ascend_toolkit_install.info (8.5.0)"), for the run's header.
    detected: tuple[str, ...] = ()

    def kernel_csv(self, kernel_type: str) -> Path:
        return self.directory / f"{validate_kernel_type(kernel_type)}.csv"

    @property
    def reports_dir(self) -> Path:
        return self.directory / "reports"


def derive_location(root: str | Path, device: str, stack: str, version_dir: str) -> DatabaseLocation:
    directory = (
        Path(root)
        / _component(device, "device")
        / _component(stack, "stack")
        / _component(version_dir, "version directory")
    )
    return DatabaseLocation(directory, True, device, stack, version_dir)


def explicit_location(path: str | Path) -> DatabaseLocation:
    return DatabaseLocation(Path(path), False)


def comm_version_dir(ccl: str, ccl_version: str) -> str:
    """The version directory of a collective library: ``v8.5`` for HCCL (CANN 8.5), else as given."""
    bare = ccl_version.removeprefix("v")
    # an empty version stays empty, so the directory check below refuses it
    return "v" + bare if ccl == ASCEND_CCL and bare else ccl_version


def comm_directory(root: str | Path, device: str, ccl: str, ccl_version: str) -> Path:
    return (
        Path(root)
        / _component(device, "device")
        / _component(ccl, "collective library")
        / _component(comm_version_dir(ccl, ccl_version), "collective library version")
    )


def list_kernel_csvs(directory: str | Path) -> list[Path]:
    """Compute CSVs of a database directory, sorted by name (collective/quarantine files excluded)."""
    base = Path(directory)
    if not base.is_dir():
        return []
    return sorted(
        p
        for p in base.glob("*.csv")
        if not p.name.startswith(".") and not p.name.endswith(".quarantine.csv")
    )


# The CPU database shipped with the repository.  A device whose derived directory does not exist
# yet starts from this sample's shapes (identity columns only).
SHIPPED_SAMPLE_PARTS = ("CPU_X86_64", "torch", "torch2.13.0")


def shipped_sample_dir(root: str | Path) -> Path:
    return Path(root).joinpath(*SHIPPED_SAMPLE_PARTS)
