"""The collective library of a run: HCCL on an NPU, NCCL on CUDA, gloo on the CPU.

A ``CclSpec`` ties a collective library to the device backend that declares it
(``perf_plugin.backends``): which ``init_process_group`` backend, which device a rank binds
(``Backend.bind``: ``npu:{LOCAL_RANK}``, ``cuda:{LOCAL_RANK}``), which variable limits the visible
devices, and the names of the output directory ``{root}/{device}/{ccl}/{ccl_version}``.  Nothing
here names a device kind: what differs between them is the backend's.  ``torch_npu`` is imported
only when an HCCL rank binds its device, so nothing here needs it to construct or test the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from perf_plugin.backends.base import Backend
from perf_plugin.backends.select import BACKEND_CLASSES, detect_backend_class
from perf_plugin.comm.settings import CommConfigError, CommSettings
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.paths import comm_directory

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CclSpec:
    ccl: str  # the init_process_group backend and the database directory name
    backend: type[Backend]  # the device backend whose collective library this is

    @property
    def visible_devices_var(self) -> str | None:
        return self.backend.visible_devices_var

    def device_string(self, local_rank: int) -> str:
        return self.backend.device_string(local_rank)

    def init_kwargs(self, timeout_s: float, device: "torch.device | None" = None) -> dict[str, Any]:
        """Keyword arguments of ``torch.distributed.init_process_group`` under torchrun (env://)."""
        kwargs: dict[str, Any] = {"backend": self.ccl, "init_method": "env://", "timeout": timedelta(seconds=timeout_s)}
        if device is not None and self.backend.eager_ccl_init:
            kwargs["device_id"] = device  # eager communicator set-up on this rank's device
        return kwargs


# Each device backend declares its collective library and visible-devices variable.
CCL_SPECS: Mapping[str, CclSpec] = MappingProxyType({cls.ccl: CclSpec(cls.ccl, cls) for cls in BACKEND_CLASSES.values()})


def select_ccl(choice: str, device_backend: str | None = None) -> CclSpec:
    """``--comm-backend`` (gloo/nccl/hccl) wins; else the device ``--backend``; else detection."""
    if choice != "auto":
        return CCL_SPECS[choice]
    if device_backend in BACKEND_CLASSES:
        return CCL_SPECS[BACKEND_CLASSES[device_backend].ccl]
    return CCL_SPECS[detect_backend_class().ccl]


def rank_backend(spec: CclSpec, local_rank: int) -> Backend:
    """The device backend of a rank: device ``LOCAL_RANK`` of the collective library's kind."""
    return spec.backend(local_rank)


def activate(spec: CclSpec, local_rank: int) -> "torch.device":
    """Bind this rank to its device (before init_process_group) and return it."""
    try:
        return rank_backend(spec, local_rank).bind()
    except RuntimeError as exc:  # torch_npu missing, fewer devices than ranks
        raise CommConfigError(f"the {spec.ccl} backend cannot bind LOCAL_RANK {local_rank}: {exc}") from None


def ccl_version(spec: CclSpec, settings: CommSettings) -> str:
    """The ``{ccl_version}`` directory: given, else the library's own (CANN's for HCCL)."""
    if settings.ccl_version:
        return settings.ccl_version
    # Under the Ascend version scheme the collective library is versioned with CANN.
    if spec.backend.version_scheme == "ascend" and settings.cann_version:
        return settings.cann_version
    detected = spec.backend.ccl_version()
    if not detected:
        option = "--cann-version" if spec.backend.version_scheme == "ascend" else "--comm-ccl-version"
        raise CommConfigError(f"{spec.ccl} results are filed under {spec.ccl}/{{version}}: give {option} (e.g. 8.5)")
    return detected


def device_dir_name(spec: CclSpec, settings: CommSettings, local_rank: int = 0) -> str:
    """The ``{device}`` directory: given, else the backend's device name (the Ascend default label,
    the CUDA device's name, CPU_<arch>)."""
    if settings.device:
        return settings.device
    return rank_backend(spec, local_rank).device_name()


def output_directory(spec: CclSpec, settings: CommSettings, rootdir: str | Path, local_rank: int = 0) -> Path:
    """``--comm-output-dir``, else ``{database root}/{device}/{ccl}/{ccl_version}``."""
    if settings.output_dir is not None:
        return settings.output_dir
    root = settings.database_root or Path(rootdir) / "database" / "data"
    try:
        return comm_directory(root, device_dir_name(spec, settings, local_rank), spec.ccl, ccl_version(spec, settings))
    except DatabaseError as exc:  # a name that cannot be a directory
        raise CommConfigError(str(exc)) from None
