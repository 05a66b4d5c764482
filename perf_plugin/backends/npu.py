"""The Ascend NPU backend (torch_npu), imported lazily.

Never run on a device by this project's CI: it is written against torch_npu's public API
(``torch.npu.*`` after ``import torch_npu``) and exercised only through what runs without the
device.  Timing on an NPU comes from msprof's ``op_summary`` (the whole pytest session runs under
``msprof``), so this backend selects the ``msprof`` collector.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.backends.ascend_versions import cann_directory_version, find_cann_version
from perf_plugin.backends.base import Backend
from perf_plugin.database.paths import DEFAULT_ASCEND_DEVICE

if TYPE_CHECKING:
    import torch


def import_torch_npu() -> Any:
    """Import torch_npu or raise a clear error (no traceback for a missing optional package)."""
    try:
        import torch_npu  # noqa: F401  (registers the 'npu' device with torch)
    except ImportError as exc:
        raise RuntimeError(
            "the npu backend needs torch_npu (pip install torch_npu matching your torch and CANN)"
        ) from exc
    return torch_npu


class NpuBackend(Backend):
    name = "npu"
    ccl = "hccl"
    visible_devices_var = "ASCEND_RT_VISIBLE_DEVICES"
    collector = "msprof"
    version_scheme = "ascend"
    environment_section = "ascend"
    launches_named_apis = True

    def __init__(self, index: int = 0, device_label: str = DEFAULT_ASCEND_DEVICE) -> None:
        super().__init__(index)
        self.device_label = device_label

    @staticmethod
    def available() -> bool:
        try:
            import_torch_npu()
            import torch

            return bool(torch.npu.is_available())  # type: ignore[attr-defined]
        except Exception:
            return False

    @staticmethod
    def device_count() -> int:
        import_torch_npu()
        import torch

        return int(torch.npu.device_count())  # type: ignore[attr-defined]

    def torch_device(self) -> "torch.device":
        import_torch_npu()
        import torch

        return torch.device(f"npu:{self.index}")

    def device_name(self) -> str:
        # Ascend databases are named by deployment label (e.g. ATLAS_800_A3_752T_128G_DIE), which
        # the chip name (torch.npu.get_device_name -> 'Ascend910_9392') does not give.
        return self.device_label

    def accelerator_version(self) -> tuple[str, str] | None:
        return ("cann", cann_version() or "unknown")

    def synchronize(self) -> None:
        import torch

        torch.npu.synchronize()  # type: ignore[attr-defined]

    def bind(self) -> "torch.device":
        import_torch_npu()
        import torch

        count = torch.npu.device_count()  # type: ignore[attr-defined]
        if self.index >= count:
            raise RuntimeError(f"there is no NPU {self.index}: {count} visible")
        torch.npu.set_device(f"npu:{self.index}")  # type: ignore[attr-defined]
        return self.torch_device()

    def timing_event(self) -> Any | None:
        import torch

        return torch.npu.Event  # type: ignore[attr-defined]

    @staticmethod
    def ccl_version() -> str | None:
        # HCCL ships with CANN and is filed under its major.minor, as the compute directory's
        # cann<C> is (op_mapping.yaml points at hccl/v8.5 from vllm..._cann8.5)
        release = cann_version()
        return cann_directory_version(release) if release else None

    def free_memory_bytes(self) -> int | None:
        import torch

        free, _total = torch.npu.mem_get_info(self.index)  # type: ignore[attr-defined]
        return int(free)

    def empty_cache(self) -> None:
        import torch

        torch.npu.empty_cache()  # type: ignore[attr-defined]

    def format_cast(self, tensor: "torch.Tensor", acl_format: int) -> "torch.Tensor":
        return import_torch_npu().npu_format_cast(tensor, acl_format)  # type: ignore[no-any-return]

    def group_comm_name(self, group: Any, rank: int) -> str:
        # torch_npu's documented way, which vllm-ascend's MoE layers use for their all-to-all group:
        # the group's HCCL backend (a default or new_group group), asked for the rank's communicator.
        import torch

        import_torch_npu()
        return str(group._get_backend(torch.device(self.name)).get_hccl_comm_name(rank))


def cann_version() -> str | None:
    """CANN's product release (``8.5.0``, ``8.3.RC2``) from the toolkit's install files, if installed.

    ``perf_plugin.backends.ascend_versions`` says which files and why not ``Version=`` first.
    """
    found = find_cann_version()
    return found.value if found else None
