"""Registry of replays keyed by kernel type.

Replay modules register their classes with ``@register``; ``load_builtin_replays`` imports the
modules that ship with the package.  ``op_mapping.yaml`` (when a database directory has one) can
point a kernel type at a registered replay through ``replay: <KernelType>``; see
``perf_plugin.replay.op_mapping``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from perf_plugin.replay.base import OpReplay

_REGISTRY: dict[str, OpReplay] = {}

BUILTIN_MODULES: tuple[str, ...] = (
    "perf_plugin.replay.matmul",
    "perf_plugin.replay.elementwise",
    "perf_plugin.replay.norm",
    "perf_plugin.replay.activation",
    "perf_plugin.replay.memory",
)


def register(cls: type[OpReplay]) -> type[OpReplay]:
    instance = cls()
    for kernel_type in cls.kernel_types:
        existing = _REGISTRY.get(kernel_type)
        # The same class seen again (its module re-imported, as pytester's in-process runs do)
        # replaces itself; two different classes claiming one kernel type is a bug.
        if existing is not None and _qualified(type(existing)) != _qualified(cls):
            raise ValueError(f"kernel type {kernel_type!r} registered twice")
        _REGISTRY[kernel_type] = instance
    return cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_builtins_loaded = False


def load_builtin_replays() -> None:
    """Import the shipped replay modules once (lookups happen per row and per case)."""
    global _builtins_loaded
    if _builtins_loaded:
        return
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    _builtins_loaded = True


def get_replay(kernel_type: str) -> OpReplay | None:
    load_builtin_replays()
    return _REGISTRY.get(kernel_type)


def registered_kernel_types() -> list[str]:
    load_builtin_replays()
    return sorted(_REGISTRY)


def replay_factory() -> Callable[[str], OpReplay | None]:
    return get_replay
