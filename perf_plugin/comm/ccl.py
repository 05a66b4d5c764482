"""The collective library of a run: HCCL on an NPU, NCCL on CUDA, gloo on the CPU.

Everything device-specific about a rank lives here: which ``init_process_group`` backend, which
device a rank binds (``npu:{LOCAL_RANK}`` after ``torch.npu.set_device``, ``cuda:{LOCAL_RANK}``
after ``torch.cuda.set_device``), which variable limits the visible devices, and the names of the
output directory ``{root}/{device}/{ccl}/{ccl_version}``.  ``torch_npu`` is imported only when an
HCCL run starts, so nothing here needs it to construct or test the plan.
"""

from __future__ import annotations

import importlib.util
import platform
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from perf_plugin.backends.select import BACKEND_CLASSES
from perf_plugin.comm.settings import CommConfigError, CommSettings
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.paths import DEFAULT_ASCEND_DEVICE, comm_directory, sanitise_device_name

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CclSpec:
    ccl: str  # the init_process_group backend and the database directory name
    device_type: str  # cpu, cuda, npu
    visible_devices_var: str | None

    def device_string(self, local_rank: int) -> str:
        return "cpu" if self.device_type == "cpu" else f"{self.device_type}:{local_rank}"

    def init_kwargs(self, timeout_s: float) -> dict[str, Any]:
        """Keyword arguments of ``torch.distributed.init_process_group`` under torchrun (env://)."""
        return {"backend": self.ccl, "init_method": "env://", "timeout": timedelta(seconds=timeout_s)}


# Each device backend declares its collective library and visible-devices variable.
CCL_SPECS: Mapping[str, CclSpec] = MappingProxyType(
    {cls.ccl: CclSpec(cls.ccl, cls.name, cls.visible_devices_var) for cls in BACKEND_CLASSES.values()}
)


def _npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        from perf_plugin.backends.npu import import_torch_npu

        import_torch_npu()
        import torch

        return bool(torch.npu.is_available())  # type: ignore[attr-defined]
    except Exception:
        return False


def select_ccl(choice: str, device_backend: str | None = None) -> CclSpec:
    """``--comm-backend`` (gloo/nccl/hccl) wins; else the device ``--backend``; else detection."""
    if choice != "auto":
        return CCL_SPECS[choice]
    if device_backend in BACKEND_CLASSES:
        return CCL_SPECS[BACKEND_CLASSES[device_backend].ccl]
    if _npu_available():
        return CCL_SPECS["hccl"]
    import torch

    return CCL_SPECS["nccl" if torch.cuda.is_available() else "gloo"]


def activate(spec: CclSpec, local_rank: int) -> "torch.device":
    """Bind this rank to its device (before init_process_group) and return it."""
    import torch

    if spec.device_type == "npu":
        try:
            from perf_plugin.backends.npu import import_torch_npu

            import_torch_npu()
        except RuntimeError as exc:
            raise CommConfigError(f"the hccl backend needs torch_npu: {exc}") from None
        count = torch.npu.device_count()  # type: ignore[attr-defined]
        if local_rank >= count:
            raise CommConfigError(f"rank with LOCAL_RANK {local_rank} has no NPU: {count} visible")
        torch.npu.set_device(spec.device_string(local_rank))  # type: ignore[attr-defined]
    elif spec.device_type == "cuda":
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise CommConfigError(f"rank with LOCAL_RANK {local_rank} has no CUDA device: {count} visible")
        torch.cuda.set_device(local_rank)
    return torch.device(spec.device_string(local_rank))


def ccl_version(spec: CclSpec, settings: CommSettings) -> str:
    """The ``{ccl_version}`` directory: CANN for HCCL, NCCL's own version, torch's for gloo."""
    if settings.ccl_version:
        return settings.ccl_version
    if spec.ccl == "hccl":
        if settings.cann_version:
            return settings.cann_version
        from perf_plugin.backends.npu import cann_version

        detected = cann_version()
        if not detected:
            raise CommConfigError("HCCL results are filed under hccl/{cann_version}: give --cann-version (e.g. 8.5)")
        return detected
    import torch

    if spec.ccl == "nccl":
        return ".".join(str(part) for part in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
    return torch.__version__.split("+", 1)[0]


def device_dir_name(spec: CclSpec, settings: CommSettings, local_rank: int = 0) -> str:
    """The ``{device}`` directory: given, the Ascend default, the CUDA device name, or CPU_<arch>."""
    if settings.device:
        return settings.device
    if spec.ccl == "hccl":
        return DEFAULT_ASCEND_DEVICE
    if spec.ccl == "nccl":
        import torch

        return sanitise_device_name(torch.cuda.get_device_name(local_rank))
    return sanitise_device_name(f"CPU_{(platform.machine() or 'unknown').upper()}")


def output_directory(spec: CclSpec, settings: CommSettings, rootdir: str | Path, local_rank: int = 0) -> Path:
    """``--comm-output-dir``, else ``{database root}/{device}/{ccl}/{ccl_version}``."""
    if settings.output_dir is not None:
        return settings.output_dir
    root = settings.database_root or Path(rootdir) / "database" / "data"
    try:
        return comm_directory(root, device_dir_name(spec, settings, local_rank), spec.ccl, ccl_version(spec, settings))
    except DatabaseError as exc:  # a name that cannot be a directory
        raise CommConfigError(str(exc)) from None
