"""Resolve the database directory of a run and start a new device's database from the sample."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.backends.ascend_versions import resolve_ascend_stack
from perf_plugin.backends.select import backend_class
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.lock import database_lock
from perf_plugin.database.paths import (
    ASCEND_STACK,
    DEFAULT_ASCEND_DEVICE,
    DatabaseLocation,
    ascend_version_dir,
    cpu_version_dir,
    cuda_version_dir,
    derive_location,
    explicit_location,
    list_kernel_csvs,
    shipped_sample_dir,
)
from perf_plugin.database.schema import IDENTITY_COLUMNS
from perf_plugin.database.table import CsvTable
from perf_plugin.options import Settings


@dataclass(frozen=True)
class DeviceIdentity:
    backend: str  # cpu / cuda / npu
    device_name: str  # directory-safe hardware name
    accelerator_version: str | None  # CUDA or CANN version, when known


def running_torch_version() -> str:
    import torch

    return torch.__version__.split("+", 1)[0]


def resolve_location(settings: Settings, identity: DeviceIdentity) -> DatabaseLocation:
    """The explicit ``--database-path`` or the path derived from device and stack versions."""
    if settings.database_path is not None:
        return explicit_location(settings.database_path)
    scheme = backend_class(identity.backend).version_scheme
    if scheme == "ascend":
        versions = resolve_ascend_stack(
            settings.vllm_version, settings.torch_version, settings.cann_version, running_torch_version
        )
        location = derive_location(
            settings.database_root,
            settings.device or DEFAULT_ASCEND_DEVICE,
            ASCEND_STACK,
            ascend_version_dir(versions.vllm, versions.torch, versions.cann),
        )
        return dataclasses.replace(location, detected=versions.detected)
    torch_version = settings.torch_version or running_torch_version()
    stack = "vllm" if settings.vllm_version else "torch"
    device = settings.device or identity.device_name
    if scheme == "torch+accelerator":
        cuda = settings.cuda_version or identity.accelerator_version or "unknown"
        version_dir = cuda_version_dir(torch_version, cuda, settings.vllm_version)
    else:
        version_dir = cpu_version_dir(torch_version, settings.vllm_version)
    return derive_location(settings.database_root, device, stack, version_dir)


def seed_from_sample(location: DatabaseLocation, root: Path, lock_timeout: float = 60.0) -> str | None:
    """Create a derived database that does not exist yet from the shipped sample's shapes.

    Returns a line saying what was done, or None when the directory already has CSVs.
    Raises DatabaseError when there is neither a database nor a sample.
    """
    if list_kernel_csvs(location.directory):
        return None
    if not location.derived:
        # an explicit path is never created: a mistyped --perf-database-path must say what it is
        if not location.directory.exists():
            raise DatabaseError(f"database directory {location.directory} does not exist")
        if not location.directory.is_dir():
            raise DatabaseError(f"database directory {location.directory} is not a directory")
        raise DatabaseError("database directory has no kernel CSVs", path=location.directory)
    sample = shipped_sample_dir(root)
    sources = list_kernel_csvs(sample)
    if not sources:
        raise DatabaseError(
            "database directory does not exist and there is no shipped sample to start from"
            f" (looked in {sample})",
            path=location.directory,
        )
    rows = 0
    with database_lock(location.directory, lock_timeout):
        if list_kernel_csvs(location.directory):  # another session seeded it meanwhile
            return None
        for source in sources:
            table = CsvTable.read(source)
            columns = [c for c in IDENTITY_COLUMNS if table.has_column(c)]
            seeded = CsvTable.new(columns, table.newline)
            for i in range(len(table)):
                if not table.is_blank(i):
                    seeded.append_row({c: table.get(i, c) for c in columns})
                    rows += 1
            seeded.write(location.directory / source.name)
    return (
        f"database {location.directory} did not exist: started it from the shipped sample"
        f" {sample} ({len(sources)} kernel types, {rows} rows, identity columns only)"
    )


def describe_location(location: DatabaseLocation) -> str:
    how = "derived from device and versions" if location.derived else "given with --database-path"
    if location.detected:
        how += "; detected " + ", ".join(location.detected)
    return f"{location.directory} ({how})"


def relative_to_cwd(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
