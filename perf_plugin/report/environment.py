"""The environment a run measured in, captured automatically for the run reports.

``collect_env_spec`` answers the questions someone comparing two runs asks first: which
Python / torch / CUDA / CANN build, which CPU and accelerators, which visibility and threading
variables, which commit of the repository.  It must cost nothing noticeable at the end of a run
and must never turn a finished run into a failure, so:

* nothing heavy is imported: torch and torch_npu are read from ``sys.modules`` when the run
  already imported them, otherwise from package metadata (and torch's ``version.py`` as text);
* CUDA is queried through torch only when this process already initialised it; otherwise the
  GPUs are read from ``/proc/driver/nvidia`` and, on the CUDA backend only, ``nvidia-smi``;
* subprocesses (``git``, ``nvidia-smi``) share one small time budget and may simply be absent;
* every section is guarded: a failure becomes an entry in ``errors``, never an exception.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# Subprocesses together may take this long; the rest of the work is in-process and takes
# a few milliseconds.
SUBPROCESS_BUDGET_S = 0.35

ENV_VARS: tuple[str, ...] = (
    "CUDA_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "ASCEND_TOOLKIT_HOME",
    "ASCEND_HOME_PATH",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_NPU_ALLOC_CONF",
    "PYTEST_XDIST_WORKER_COUNT",
)
ENV_PREFIXES: tuple[str, ...] = ("PERF_",)

PACKAGES: tuple[str, ...] = ("pytest", "pytest-xdist", "pytest-benchmark", "pandas", "numpy", "pyyaml")

# Arm cores report an implementer and a part number instead of a model name.
_ARM_PARTS: dict[tuple[str, str], str] = {
    ("0x48", "0xd01"): "HiSilicon Kunpeng-920",
    ("0x48", "0xd02"): "HiSilicon Kunpeng-930",
    ("0x41", "0xd0c"): "Arm Neoverse-N1",
    ("0x41", "0xd40"): "Arm Neoverse-V1",
    ("0x41", "0xd49"): "Arm Neoverse-N2",
    ("0x41", "0xd4f"): "Arm Neoverse-V2",
}


class _Budget:
    """Shared deadline for subprocesses, so a slow tool cannot stall the end of a run."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


def _run(command: list[str], budget: _Budget, cwd: str | Path | None = None) -> str | None:
    """stdout of a command, or None when it is absent, fails or runs out of time."""
    timeout = budget.remaining()
    if timeout <= 0.01:
        return None
    try:
        completed = subprocess.run(
            command,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if completed.returncode != 0:
        return None
    return completed.stdout.strip()


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------- sections
def _python() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


def _host() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "system": platform.system(),
        "machine": platform.machine(),
    }


def cpu_model(cpuinfo: str | None) -> str | None:
    """The CPU's model from ``/proc/cpuinfo`` text (x86 ``model name``, Arm implementer/part)."""
    if not cpuinfo:
        return None
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    for key in ("model name", "Model Name", "cpu model", "Hardware"):
        if fields.get(key):
            return fields[key]
    implementer, part = fields.get("CPU implementer", ""), fields.get("CPU part", "")
    if implementer and part:
        return _ARM_PARTS.get((implementer.lower(), part.lower()), f"implementer {implementer} part {part}")
    return None


def _cpu() -> dict[str, Any]:
    model = cpu_model(_read("/proc/cpuinfo")) or platform.processor() or platform.machine() or None
    try:
        available: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        available = None
    return {"model": model, "logical_count": os.cpu_count(), "available_count": available}


def _torch_version_path() -> Path | None:
    try:
        # The installed distribution's own file list: works whatever sys.modules holds.
        return Path(str(importlib.metadata.distribution("torch").locate_file("torch/version.py")))
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "version.py"


def _torch_version_file() -> dict[str, Any]:
    """torch's ``version.py`` read as text: the build facts without importing torch (which
    takes seconds)."""
    path = _torch_version_path()
    text = (_read(path) if path is not None else None) or ""
    facts: dict[str, Any] = {}
    for key, name in (("version", "__version__"), ("cuda", "cuda"), ("hip", "hip"), ("git_version", "git_version")):
        match = re.search(rf"^{name}\s*(?::[^=]*)?=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", text, re.MULTILINE)
        if match:
            facts[key] = match.group(1) if match.group(1) is not None else match.group(2)
    return facts


def _torch() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "version"):
        facts = _torch_version_file()
        version = facts.get("version") or package_version("torch")
        return {"version": version, "cuda": facts.get("cuda"), "hip": facts.get("hip"),
                "git_version": facts.get("git_version"), "imported": False}
    info: dict[str, Any] = {
        "version": str(torch.__version__),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "git_version": getattr(torch.version, "git_version", None),
        "imported": True,
        "num_threads": torch.get_num_threads(),
    }
    if torch.version.cuda:
        info["cudnn"] = _cudnn(torch)
        try:
            nccl = torch.cuda.nccl.version()
            info["nccl"] = ".".join(str(p) for p in nccl) if isinstance(nccl, tuple) else str(nccl)
        except Exception as exc:  # noqa: BLE001 - builds without NCCL
            info["nccl"] = f"unavailable: {type(exc).__name__}"
    return info


def cudnn_text(version: int) -> str:
    """torch's cuDNN integer as dotted text: 91900 -> '9.19.0' (cuDNN 9), 8907 -> '8.9.7' (cuDNN 8)."""
    if version >= 10000:
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return f"{version // 1000}.{version // 100 % 10}.{version % 100}"


def _cudnn(torch: Any) -> str | None:
    """The cuDNN version, without initialising CUDA (asking torch does: a quarter of a second).

    Once this process initialised CUDA, torch reports the library it loaded; otherwise the
    version of the cuDNN wheel that torch's CUDA build depends on, where there is one.
    """
    if torch.cuda.is_initialized():
        version = torch.backends.cudnn.version()
        return cudnn_text(version) if version else None
    major = str(torch.version.cuda).split(".")[0]
    return package_version(f"nvidia-cudnn-cu{major}") or package_version("nvidia-cudnn")


def nvidia_driver(version_text: str | None) -> str | None:
    """Driver version from ``/proc/driver/nvidia/version`` (``... Kernel Module  580.159.04 ...``)."""
    if not version_text:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", version_text)
    return match.group(1) if match else None


def _proc_gpu_names() -> list[str]:
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        for line in (_read(info) or "").splitlines():
            if line.startswith("Model:"):
                names.append(line.split(":", 1)[1].strip())
    return names


def _cuda_devices(in_use: bool, budget: _Budget) -> dict[str, Any] | None:
    torch = sys.modules.get("torch")
    driver = nvidia_driver(_read("/proc/driver/nvidia/version"))
    if torch is not None and getattr(torch, "version", None) is not None and torch.version.cuda:
        cuda = torch.cuda
        if cuda.is_initialized():
            count = cuda.device_count()
            names = [cuda.get_device_name(i) for i in range(count)]
            capability = [".".join(map(str, cuda.get_device_capability(i))) for i in range(count)]
            return {"source": "torch.cuda", "count": count, "names": names, "capability": capability,
                    "driver": driver}
    names = _proc_gpu_names()
    if names:
        # The driver lists every GPU of the host; CUDA_VISIBLE_DEVICES (in env) says which were used.
        return {"source": "/proc/driver/nvidia", "count": len(names), "names": names, "driver": driver}
    if not in_use:  # nvidia-smi costs a subprocess: asked only where the run uses the GPUs
        return None
    output = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], budget)
    if not output:
        return {"source": None, "count": None, "names": [], "driver": driver}
    rows = [[cell.strip() for cell in line.split(",")] for line in output.splitlines() if line.strip()]
    return {"source": "nvidia-smi", "count": len(rows), "names": [r[0] for r in rows],
            "driver": driver or (rows[0][-1] if rows and len(rows[0]) > 1 else None)}


def _ascend(in_use: bool) -> dict[str, Any] | None:
    torch_npu_module = sys.modules.get("torch_npu")
    torch_npu = (
        str(getattr(torch_npu_module, "__version__", "")) or None
        if torch_npu_module is not None
        else package_version("torch_npu")
    )
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    from perf_plugin.backends.npu import cann_version  # light: no torch_npu import

    cann = cann_version()
    if not in_use and torch_npu is None and cann is None:
        return None
    info: dict[str, Any] = {"torch_npu": torch_npu, "cann": cann, "toolkit_home": home}
    torch = sys.modules.get("torch")
    npu = getattr(torch, "npu", None) if torch_npu_module is not None else None
    if npu is not None and getattr(npu, "is_initialized", lambda: False)():
        count = npu.device_count()
        info["count"] = count
        info["names"] = [npu.get_device_name(i) for i in range(count)]
    return info


def _env_vars() -> dict[str, str]:
    chosen = {name: os.environ[name] for name in ENV_VARS if name in os.environ}
    for name in sorted(os.environ):
        if name.startswith(ENV_PREFIXES):
            chosen[name] = os.environ[name]
    return chosen


def _packages() -> dict[str, str | None]:
    return {name: package_version(name) for name in PACKAGES}


def _git(cwd: str | Path | None, budget: _Budget) -> dict[str, Any] | None:
    commit = _run(["git", "rev-parse", "HEAD"], budget, cwd)
    if not commit:
        return None
    info: dict[str, Any] = {"commit": commit}
    branch = _run(["git", "rev-parse", "--abbrev-ref", "HEAD"], budget, cwd)
    if branch:
        info["branch"] = branch
    # Tracked changes only: untracked files (reports, caches) say nothing about the code.
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], budget, cwd)
    info["dirty"] = bool(status) if status is not None else None
    return info


# ----------------------------------------------------------------------------- entry point
def collect_env_spec(
    backend: str, cwd: str | Path | None = None, subprocess_budget_s: float = SUBPROCESS_BUDGET_S
) -> dict[str, Any]:
    """A JSON-ready description of this process's environment; never raises.

    ``cwd`` is the directory whose git commit is recorded (the current directory by default).
    Sections that do not apply are ``None``; a section that failed is ``None`` and its error is
    listed under ``errors``.  ``subprocess_budget_s`` caps the time all subprocesses together
    may take; what they did not answer in time is ``None``.
    """
    from perf_plugin.backends.select import BACKEND_CLASSES

    started = time.perf_counter()
    budget = _Budget(subprocess_budget_s)
    backend_cls = BACKEND_CLASSES.get(backend)
    in_use = backend_cls.environment_section if backend_cls is not None else None
    errors: dict[str, str] = {}

    def guarded(name: str, section: Callable[[], Any]) -> Any:
        try:
            return section()
        except Exception as exc:  # noqa: BLE001 - the env spec must never fail a finished run
            errors[name] = f"{type(exc).__name__}: {exc}"
            return None

    spec: dict[str, Any] = {
        "collected_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "backend": backend,
        "python": guarded("python", _python),
        "host": guarded("host", _host),
        "cpu": guarded("cpu", _cpu),
        "torch": guarded("torch", _torch),
        "cuda_devices": guarded("cuda_devices", lambda: _cuda_devices(in_use == "cuda_devices", budget)),
        "ascend": guarded("ascend", lambda: _ascend(in_use == "ascend")),
        "packages": guarded("packages", _packages),
        "env": guarded("env", _env_vars),
        "git": guarded("git", lambda: _git(cwd, budget)),
    }
    spec["errors"] = errors
    spec["collect_seconds"] = round(time.perf_counter() - started, 4)
    return spec
