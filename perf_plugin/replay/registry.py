"""The kernel catalog: every replay the installation has, found by discovery, and what each declares.

A kernel type lives in one file.  Its replay class (``OpReplay``) declares the kernel types it
replays, the family they belong to, how their rows are compared (``SignatureRule``), the traced
operators they stand for (trace ingest) and the API that launches them on an NPU.  Nothing else
names it: the catalog is built by

* importing every module of the package ``perf_plugin.replay.kernels`` (a new module there is a
  new kernel type, with no other file touched), and
* loading the entry points of the group ``perf_plugin.replays`` (third-party replays: the value
  names a module, whose replay classes are all taken, or one class, ``package.module:Class``).

A replay class is a concrete ``OpReplay`` subclass with a non-empty ``kernel_types`` defined in
the module itself (classes it imports are not counted twice).  Two classes claiming one kernel
type is an error naming both.  Entry points can change while a process lives (an install, or a
test that adds a distribution to ``sys.path``), so a run builds its catalog once at its start
(``refresh_catalog``) and looks kernel types up in that object afterwards.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType, ModuleType

from perf_plugin.database.signature import PLAIN, Signature, SignatureRule, row_signature
from perf_plugin.replay.base import OpReplay
from perf_plugin.trace.mapped import TraceMapper

KERNEL_PACKAGE = "perf_plugin.replay.kernels"
ENTRY_POINT_GROUP = "perf_plugin.replays"


class CatalogError(Exception):
    """The replays cannot be loaded (a broken entry point, two classes for one kernel type)."""


@dataclass(frozen=True)
class KernelCatalog:
    """Kernel type -> its replay, and the declarations the rest of the package reads."""

    replays: Mapping[str, OpReplay] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)  # kernel type -> "module:Class"
    prefixed: Mapping[str, OpReplay] = field(default_factory=dict)  # name prefix -> replay

    def replay(self, kernel_type: str) -> OpReplay | None:
        replay = self.replays.get(kernel_type)
        if replay is not None:
            return replay
        for prefix, candidate in self.prefixed.items():
            if kernel_type.startswith(prefix) and len(kernel_type) > len(prefix):
                return candidate
        return None

    def kernel_types(self) -> list[str]:
        return sorted(self.replays)

    def family(self, kernel_type: str) -> str:
        """The kernel types one call may launch (the library's choice) share a family name;
        every other kernel type is a family of its own."""
        replay = self.replay(kernel_type)
        return (replay.family if replay is not None else None) or kernel_type

    def family_members(self, family: str) -> list[str]:
        return sorted(k for k in self.replays if self.family(k) == family) or [family]

    def signature_rule(self, kernel_type: str) -> SignatureRule:
        replay = self.replay(kernel_type)
        return replay.signature_rule if replay is not None else PLAIN

    def signature(self, kernel_type: str, cells: Mapping[str, str]) -> Signature:
        return row_signature(cells, self.signature_rule(kernel_type))

    def npu_api(self, kernel_type: str) -> str | None:
        replay = self.replay(kernel_type)
        return replay.npu_api if replay is not None else None

    @cached_property
    def trace_mappers(self) -> dict[str, list[TraceMapper]]:
        """Traced operator name (``aten::mm``) -> the mappers declared for it, in catalog order."""
        mappers: dict[str, list[TraceMapper]] = {}
        seen: set[int] = set()
        for kernel_type in self.kernel_types():
            replay = self.replays[kernel_type]
            if id(replay) in seen:
                continue
            seen.add(id(replay))
            for op_name, mapper in replay.trace_ops.items():
                mappers.setdefault(op_name, []).append(mapper)
        return mappers

    @cached_property
    def trace_primary(self) -> frozenset[str]:
        """Kernel types that win when a wrapper operator called several mapped operators."""
        return frozenset(k for k, replay in self.replays.items() if replay.trace_primary)


def replay_classes_in(module: ModuleType) -> list[type[OpReplay]]:
    """The replay classes a module defines (not those it imports), by name."""
    found = []
    for _, value in inspect.getmembers(module, inspect.isclass):
        if (
            issubclass(value, OpReplay)
            and value.__module__ == module.__name__
            and (value.kernel_types or value.kernel_type_prefixes)
            and not inspect.isabstract(value)
        ):
            found.append(value)
    return found


def _builtin_modules() -> list[ModuleType]:
    package = importlib.import_module(KERNEL_PACKAGE)
    names = sorted(info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_"))
    return [importlib.import_module(f"{KERNEL_PACKAGE}.{name}") for name in names]


def _entry_point_classes(points: Iterable[EntryPoint]) -> list[tuple[type[OpReplay], str]]:
    classes: list[tuple[type[OpReplay], str]] = []
    for point in points:
        where = f"entry point {point.name!r} = {point.value!r} (group {ENTRY_POINT_GROUP})"
        try:
            loaded = point.load()
        except Exception as exc:  # noqa: BLE001 - a third-party import error of any kind
            raise CatalogError(f"{where} cannot be loaded: {type(exc).__name__}: {exc}") from None
        if isinstance(loaded, ModuleType):
            found = replay_classes_in(loaded)
            if not found:
                raise CatalogError(f"{where} names a module with no replay class (an OpReplay with kernel_types)")
            classes.extend((cls, where) for cls in found)
        elif inspect.isclass(loaded) and issubclass(loaded, OpReplay) and (loaded.kernel_types or loaded.kernel_type_prefixes):
            classes.append((loaded, where))
        else:
            raise CatalogError(f"{where} names neither a module nor an OpReplay class with kernel_types")
    return classes


def build_catalog(extra: Iterable[tuple[type[OpReplay], str]] = ()) -> KernelCatalog:
    """Discover the built-in replay modules and the installed entry points (see the module docstring)."""
    classes = [(cls, f"{cls.__module__}:{cls.__qualname__}") for module in _builtin_modules() for cls in replay_classes_in(module)]
    classes += _entry_point_classes(entry_points(group=ENTRY_POINT_GROUP))
    classes += list(extra)
    replays: dict[str, OpReplay] = {}
    sources: dict[str, str] = {}
    prefixed: dict[str, OpReplay] = {}
    for cls, source in classes:
        instance = cls()
        claims = [(name, replays) for name in cls.kernel_types] + [(prefix, prefixed) for prefix in cls.kernel_type_prefixes]
        for name, table in claims:
            key = name if table is replays else f"{name}*"
            if key in sources and sources[key] != source:
                raise CatalogError(f"kernel type {key!r} has two replays: {sources[key]} and {source}")
            table[name] = instance
            sources[key] = source
    return KernelCatalog(MappingProxyType(replays), MappingProxyType(sources), MappingProxyType(prefixed))


_current: KernelCatalog | None = None


def refresh_catalog(extra_modules: Iterable[ModuleType | str] = ()) -> KernelCatalog:
    """Build the catalog anew (at the start of a run or command) and make it the current one;
    ``extra_modules`` (modules or dotted names, from ``pytest_perf_replay_modules``) join it."""
    global _current
    extra = []
    for module in extra_modules:
        loaded = importlib.import_module(module) if isinstance(module, str) else module
        extra += [(cls, f"{loaded.__name__}:{cls.__qualname__}") for cls in replay_classes_in(loaded)]
    _current = build_catalog(extra)
    return _current


def catalog() -> KernelCatalog:
    """The current catalog (built on first use)."""
    return _current if _current is not None else refresh_catalog()


def get_replay(kernel_type: str) -> OpReplay | None:
    return catalog().replay(kernel_type)


def registered_kernel_types() -> list[str]:
    return catalog().kernel_types()


def signature_of(kernel_type: str, cells: Mapping[str, str]) -> Signature:
    """A row's signature under its kernel type's rule (the one way every reader compares rows)."""
    return catalog().signature(kernel_type, cells)
