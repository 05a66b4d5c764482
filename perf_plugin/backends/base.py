"""What the harness needs to know about a device kind, behind one small interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class Backend(ABC):
    """One device kind: CPU, CUDA or an Ascend NPU.

    ``name`` is what users pass to ``--perf-backend``; ``stack`` and ``version_dir`` feed the database
    directory contract; ``ccl`` names the collective library directory.
    """

    name: str = ""
    ccl: str = ""
    visible_devices_var: str | None = None
    # The collector kind that measures this backend: "torch" (in process) or "msprof" (whole run).
    collector: str = "torch"
    # Whether replays launch their kernels through the API op_mapping.yaml names (an NPU, where a
    # torch composition would record other kernel types) rather than their portable ``run``.
    launches_named_apis: bool = False
    # What ``--perf-cache-mode auto`` means here (perf_plugin.replay.cache_modes says why).
    auto_cache_mode: str = "warm"
    # ``auto``: rows whose profile shows a kernel of at least this many microseconds are replayed
    # in ``produced`` (None: every row in ``auto_cache_mode``)
    auto_produced_from_us: float | None = None
    # The tensor shape of the kernels that evict the instruction caches before each repeat of the
    # produced, idle and cold cache modes (perf_plugin.replay.code_eviction): large enough to
    # occupy every compute unit of the device.
    code_eviction_shape: tuple[int, int] = (1021, 1031)
    # The torch.profiler activity that records this backend's kernels (a ProfilerActivity name),
    # and whether the in-process collector switches collection on only around the timed repeats
    # (the CPU, where every operator is an event) rather than for the whole batch.
    profiler_activity: str = "CPU"
    collection_toggles: bool = False
    # How the derived database path names this backend's stack version (perf_plugin.run.location):
    # "torch" (torch only), "torch+accelerator" (torch and the accelerator toolkit's version, from
    # accelerator_version: CUDA's) or "ascend" (vllm, torch and CANN).
    version_scheme: str = "torch"
    # Whether init_process_group is given this device (``device_id``), so the collective library
    # sets up its communicator at once on it rather than at the first collective (NCCL).
    eager_ccl_init: bool = False
    # The section of the run's environment description that describes this backend's devices
    # (perf_plugin.report.environment), probed harder when the run uses them.
    environment_section: str | None = None

    def __init__(self, index: int = 0) -> None:
        self.index = index

    @classmethod
    def device_string(cls, index: int) -> str:
        """torch's name of device ``index`` (a backend's ``name`` is torch's device type)."""
        return f"{cls.name}:{index}"

    @staticmethod
    def device_count() -> int:
        """Devices of this kind on the host (0 for the CPU: xdist workers share it)."""
        return 0

    @abstractmethod
    def torch_device(self) -> "torch.device": ...

    @abstractmethod
    def device_name(self) -> str:
        """Hardware name used as the ``{device}`` directory (already sanitised)."""

    @abstractmethod
    def accelerator_version(self) -> tuple[str, str] | None:
        """(label, version) of the accelerator stack for the version directory, e.g. ('cuda', '13.0')."""

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on the CPU)."""

    def bind(self) -> "torch.device":
        """Make this backend's device (``index``) the process's current one and return it: a
        collective rank binds before ``init_process_group``.  Raises RuntimeError when there is
        no such device."""
        return self.torch_device()

    def fp8_gemm(self) -> bool:
        """Whether the device has FP8 GEMMs (``torch._scaled_mm``) worth timing as a peak."""
        return False

    def timing_event(self) -> Any | None:
        """The event class that times a span on the device's stream (``record``/``elapsed_time``),
        or None where a host timer measures the work (the CPU)."""
        return None

    def spin_kernel(self) -> Callable[[int], None] | None:
        """Queue a kernel that spins the device for a number of clock cycles (None: none exists)."""
        return None

    @staticmethod
    def ccl_version() -> str | None:
        """The version of this backend's collective library, when it can be detected."""
        return None

    def free_memory_bytes(self) -> int | None:
        """Free device memory, or None when unknown."""
        return None

    def empty_cache(self) -> None:
        """Return cached device memory to the driver between cases where that helps."""

    def peak_memory_bytes(self) -> int | None:
        return None

    def cache_bytes(self) -> int | None:
        """Size of the last-level cache the kernels read through, or None when unknown."""
        return None

    def compute_units(self) -> int | None:
        """How many units a kernel's tiles are spread over at once (a GPU's multiprocessors), or
        None when unknown: a tiled kernel's time steps with its waves over them."""
        return None

    def generator(self, seed: int) -> "torch.Generator":
        import torch

        generator = torch.Generator(device=self.torch_device())
        generator.manual_seed(seed)
        return generator

    def format_cast(self, tensor: "torch.Tensor", acl_format: int) -> "torch.Tensor":
        """``tensor`` in a private storage format (only an NPU has them)."""
        raise NotImplementedError(f"the {self.name} backend has no private storage formats")

    def group_comm_name(self, group: Any, rank: int) -> str:
        """The collective library's name of the communicator of ``group`` (a ``torch.distributed``
        process group this process is ``rank`` of), for an API that takes the group by name."""
        raise NotImplementedError(f"the {self.name} backend's collective library names no communicators")

    def marker(self) -> Callable[[], Any] | None:
        """A launch of a tiny kernel of its own that delimits a case's repeats on the device
        timeline (None: the backend's profiler has labelled ranges instead)."""
        spin = self.spin_kernel()
        return None if spin is None else lambda: spin(1)  # one spin cycle: the cheapest kernel

    def describe(self) -> str:
        return f"{self.name} ({self.device_name()})"
