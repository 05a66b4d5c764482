"""Where a run's state comes from: its settings, the device, the database directory.

The controller keeps the resolved settings at configure time and identifies the device (which
imports torch) only when the run needs it (``ensure_run_state``): a test asks for a replay case,
xdist starts workers, or the machine may run msprof.  Each xdist worker gets the controller's
device identity through ``workerinput`` and one device of its own (``pin_worker_device``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

import pytest

from perf_plugin import options
from perf_plugin.backends.select import backend_class
from perf_plugin.database.errors import DatabaseError
from perf_plugin.replay.cache_modes import cache_mode_label
from perf_plugin.run.location import DeviceIdentity, describe_location, resolve_location
from perf_plugin.run.state import RUN_STATE, ControllerState, RunState

CONFIG_ERROR = pytest.StashKey[str]()  # why no state could be resolved (raised only if a case needs one)
SETTINGS = pytest.StashKey[options.Settings]()


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def identify_device(settings: options.Settings) -> DeviceIdentity:
    from perf_plugin.backends.select import resolve_backend

    from perf_plugin.run.shards import local_device_index

    backend = resolve_backend(settings.backend, local_device_index(), ascend_device=settings.device)
    version = backend.accelerator_version()
    return DeviceIdentity(backend.name, backend.device_name(), version[1] if version else None)


# Thread-count variables of the host's parallel runtimes (OpenMP, and MKL / OpenBLAS beside it).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def share_host_threads(workerinput: dict[str, Any], environ: MutableMapping[str, str] | None = None) -> int | None:
    """Worker: its share of the host's cores for host-side math (a case's reference, its inputs).

    Each worker process would otherwise size its OpenMP pool to every core of the host, and N
    pools of spinning threads on one set of cores slow every worker down: on a 32-core host with
    two GPUs, ``-n 2`` replayed 2,000 small rows in 21.2 s against 16.3 s for ``-n 1``, and in
    14.1 s with 4 threads a worker.  Set before torch is imported (OpenMP reads it once); a
    thread count the user set is kept.  Returns the count set, or None when nothing was changed.
    """
    env = os.environ if environ is None else environ
    workers = int(workerinput.get("workercount", 1) or 1)
    if workers < 2 or any(env.get(name) for name in THREAD_VARIABLES):
        return None
    threads = max(1, (os.cpu_count() or 1) // workers)
    for name in THREAD_VARIABLES:
        env[name] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:  # imported already (a plugin of the user's): its pool is sized, resize it
        torch.set_num_threads(threads)
    return threads


def pin_worker_device(identity: DeviceIdentity, workerinput: dict[str, Any]) -> None:
    """Worker: one device per worker, chosen before the device runtime initialises."""
    share_host_threads(workerinput)
    variable = backend_class(identity.backend).visible_devices_var
    count = int(workerinput.get("perf_device_count", 0))
    if variable is None or count < 2:
        return
    worker = int(str(workerinput.get("workerid", "gw0")).lstrip("gw") or 0)
    visible = [d for d in os.environ.get(variable, "").split(",") if d.strip()] or [str(i) for i in range(count)]
    os.environ[variable] = visible[worker % len(visible)]


def may_run_msprof(settings: options.Settings) -> bool:
    if settings.prof_path:
        return True
    if settings.backend != "auto":
        return backend_class(settings.backend).collector == "msprof"
    return settings.backend == "auto" and importlib.util.find_spec("torch_npu") is not None


def import_torch_outside_capture(config: pytest.Config) -> None:
    """Import torch, the first time, with pytest's output capture suspended.

    torch binds its logging handlers to ``sys.stderr`` as it is at import time; imported during
    collection that is pytest's capture stream, which is closed at the end of the session (and,
    in a pytest run inside another, the outer test's), so torch's warnings would go there
    rather than to the failing case's report.  Imported here they go to the process's stderr,
    which pytest's descriptor-level capture still attributes to the test that wrote them.
    """
    if "torch" in sys.modules:
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        import torch  # noqa: F401


def ensure_run_state(config: pytest.Config) -> RunState | None:
    """Controller: the run state, identifying the device on first use (None: it cannot be
    resolved; the reason is kept and raised only if a replay test is collected)."""
    state = config.stash.get(RUN_STATE, None)
    if state is not None or CONFIG_ERROR in config.stash or SETTINGS not in config.stash:
        return state
    settings = config.stash[SETTINGS]
    import_torch_outside_capture(config)
    return start_run(config, settings, lambda: identify_device(settings))


def start_run(
    config: pytest.Config, settings: options.Settings, identify: Callable[[], DeviceIdentity]
) -> RunState | None:
    try:
        identity = identify()
        location = resolve_location(settings, identity)
    except (DatabaseError, RuntimeError, ValueError) as exc:
        # Raised later, and only if a replay test is collected: unrelated runs must not fail.
        config.stash[CONFIG_ERROR] = str(exc)
        return None
    controller = None if is_worker(config) else ControllerState()
    state = RunState(settings, location, identity.backend, identity.device_name, controller)
    config.stash[RUN_STATE] = state
    return state


def no_local_workers(config: pytest.Config) -> None:
    """Controller, msprof or --perf-prof-path: xdist workers belong to the session under msprof."""
    config.option.dist = "no"
    config.option.tx = []
    if config.pluginmanager.has_plugin("dsession"):  # xdist configured before this plugin
        config.pluginmanager.unregister(name="dsession")


def device_count(backend: str) -> int:
    """Devices the controller hands out to xdist workers, one each (0: they share the CPU)."""
    return backend_class(backend).device_count()


def header_lines(config: pytest.Config) -> list[str]:
    state = config.stash.get(RUN_STATE, None)
    if state is None or state.header_shown:
        return []
    state.header_shown = True
    lines = [
        f"perf: backend {state.backend_name} ({state.device_name}), "
        f"{state.settings.repeat_count} repeats after {state.settings.warmup_count} warm-up, "
        f"{cache_mode_label(state.settings.cache_mode, state.backend_name)} cache",
        f"perf: database {describe_location(state.location)}",
    ]
    return lines + [f"perf: {note}" for note in state.notes]
