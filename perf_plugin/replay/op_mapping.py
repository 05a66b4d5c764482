"""Replay lookup that also reads the database's ``op_mapping.yaml``.

Existing Ascend databases keep an ``op_mapping.yaml`` beside the CSVs (see the real files in
tests/fixtures/ascend): under ``operator_mappings`` each framework op names its primary
``kernel_type`` and the ``alternate_kernel_types`` the same API dispatches to on other shapes or
CANN versions (``aten.add.Tensor``: ``Add``, alternate ``AddAiCore``; ``aten.mm.default``:
``MatMulV2``, alternates ``MatMulV3``, ``MatMulCommon``).  An alternate runs the same API, so a
CSV of an alternate kernel type with no replay of its own is replayed by its primary's replay.

Rules: a kernel type's own registered replay always wins; otherwise the first mapping in file
order whose primary has a replay and lists the kernel type as an alternate decides, unless the
kernel type is itself the primary of another mapping (``GatherV3`` is an alternate of
``aten.embedding`` but the primary of ``aten.index_select``: another API launches it, so the
embedding replay would not).  Mappings without a primary (composite, zero-cost) are ignored.  A
kernel type left without a replay that an ``aten.*`` mapping names (as its primary, or as an
alternate of a primary with no replay either) is replayed through that operator
(``perf_plugin.replay.mapped_aten``), the first such mapping in file order deciding.  The file is
read with ``yaml.safe_load``; a malformed file is a DatabaseError naming the file and line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.file_kind import SNIFF_BYTES, FileKind, classify
from perf_plugin.replay.base import OpReplay
from perf_plugin.replay.mapped_aten import MappedAtenReplay, split_operator
from perf_plugin.replay.registry import KernelCatalog, catalog

OP_MAPPING_FILE = "op_mapping.yaml"
PLACEHOLDER_PREFIX = "profiling."


def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        data = path.read_bytes()
        if classify(data[:SNIFF_BYTES], len(data)) is FileKind.LFS_POINTER:  # YAML would read it as one string
            raise DatabaseError(
                f"is a Git LFS pointer, not the {OP_MAPPING_FILE}: run `git lfs pull` in the database's repository",
                path=path,
            )
        return yaml.safe_load(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DatabaseError(f"not UTF-8 text (byte {exc.start})", path=path) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise DatabaseError(f"not valid YAML: {getattr(exc, 'problem', exc)}", path=path, row=line) from None
    except OSError as exc:
        raise DatabaseError(f"cannot read file: {exc.strerror}", path=path) from None


def _mappings(path: Path) -> dict[str, Any]:
    document = _read_yaml(path)
    mappings = document.get("operator_mappings") if isinstance(document, dict) else None
    if mappings is None:
        return {}
    if not isinstance(mappings, dict):
        raise DatabaseError("'operator_mappings' is not a mapping", path=path)
    return mappings


def aten_routes(path: Path, has_replay: Callable[[str], bool]) -> dict[str, tuple[str, str]]:
    """Kernel type with no replay -> (aten operator, overload) of the first mapping that names it."""
    routes: dict[str, tuple[str, str]] = {}
    for op_name, mapping in _mappings(path).items():
        operator = split_operator(str(op_name))
        if operator is None or not isinstance(mapping, dict):
            continue
        primary = mapping.get("kernel_type")
        if not isinstance(primary, str) or has_replay(primary):
            continue  # a primary with a replay stands for its alternates (replay_aliases)
        alternates = mapping.get("alternate_kernel_types") or []
        for kernel_type in (primary, *(a for a in alternates if isinstance(a, str))):
            if not has_replay(kernel_type):
                routes.setdefault(kernel_type, operator)
    return routes


def replay_aliases(path: Path, has_replay: Callable[[str], bool]) -> dict[str, str]:
    """Alternate kernel type -> the primary kernel type whose replay replays it."""
    mappings = _mappings(path)
    # Profiling-only placeholders (``profiling.<KernelType>``) name no API: not a primary that another API launches
    primaries = {
        m.get("kernel_type")
        for name, m in mappings.items()
        if isinstance(m, dict) and not str(name).startswith(PLACEHOLDER_PREFIX)
    }
    aliases: dict[str, str] = {}
    for op_name, mapping in mappings.items():
        if not isinstance(mapping, dict):
            continue
        primary = mapping.get("kernel_type")
        alternates = mapping.get("alternate_kernel_types") or []
        if not isinstance(primary, str) or not has_replay(primary):
            continue
        if not isinstance(alternates, list):
            raise DatabaseError(f"{op_name}: 'alternate_kernel_types' is not a list", path=path)
        for alternate in alternates:
            if isinstance(alternate, str) and not has_replay(alternate) and alternate not in primaries:
                aliases.setdefault(alternate, primary)
    return aliases


def replay_lookup_for(
    directory: Path, kernels: KernelCatalog | None = None
) -> tuple[Callable[[str], OpReplay | None], Callable[[str], str]]:
    """(lookup, replay kernel type) for a database directory, honouring its op_mapping.yaml."""
    kernels = catalog() if kernels is None else kernels
    path = Path(directory) / OP_MAPPING_FILE

    def has_replay(name: str) -> bool:
        return kernels.replay(name) is not None

    aliases = replay_aliases(path, has_replay) if path.exists() else {}
    routes = aten_routes(path, lambda name: has_replay(name) or name in aliases) if path.exists() else {}

    def replay_type(kernel_type: str) -> str:
        if has_replay(kernel_type):
            return kernel_type
        if kernel_type in aliases:
            return aliases[kernel_type]
        return mapped_name(*routes[kernel_type]) if kernel_type in routes else kernel_type

    def lookup(kernel_type: str) -> OpReplay | None:
        return resolve_replay(replay_type(kernel_type), kernels)

    return lookup, replay_type


MAPPED_PREFIX = "mapped:"


def mapped_name(operator: str, overload: str) -> str:
    """The replay name of a kernel type routed through ``aten.<operator>.<overload>``."""
    return f"{MAPPED_PREFIX}aten.{operator}.{overload}"


def resolve_replay(name: str, kernels: KernelCatalog | None = None) -> OpReplay | None:
    """The replay a case's ``replay_kernel_type`` names: a registered kernel type's, or a route
    through an aten operator (``mapped:aten.<op>.<overload>``, what ``replay_lookup_for`` gives)."""
    if name.startswith(MAPPED_PREFIX):
        operator = split_operator(name[len(MAPPED_PREFIX):])
        return MappedAtenReplay(*operator) if operator is not None else None
    return (catalog() if kernels is None else kernels).replay(name)


def missing_replay_reason(directory: Path, kernel_type: str, kernels: KernelCatalog | None = None) -> str:
    """Why rows of ``kernel_type`` have no replay, as ``op_mapping.yaml`` tells it.

    Names where the file mentions the kernel type (as a primary, an alternate, a Profiling-only
    placeholder) and why none of those gives it a replay, or that the file does not name it.
    """
    kernels = catalog() if kernels is None else kernels
    path = Path(directory) / OP_MAPPING_FILE
    base = f"no replay for kernel type {kernel_type}"
    if not path.exists():
        return f"{base}, and the database has no {OP_MAPPING_FILE} to route it to another kernel type's replay"
    document = _read_yaml(path)
    mappings = document.get("operator_mappings") if isinstance(document, dict) else None
    mentions = []
    for op_name, mapping in (mappings or {}).items() if isinstance(mappings, dict) else ():
        if not isinstance(mapping, dict):
            continue
        primary = mapping.get("kernel_type")
        alternates = mapping.get("alternate_kernel_types") or []
        if str(op_name).startswith(PLACEHOLDER_PREFIX) and primary == kernel_type:
            mentions.append(f"{op_name} (a Profiling-only placeholder: no API to call)")
        elif primary == kernel_type:
            mentions.append(f"{op_name} (its primary kernel type)")
        elif isinstance(alternates, list) and kernel_type in alternates:
            replayed = isinstance(primary, str) and kernels.replay(primary) is not None
            why = "another API launches it too" if replayed else f"{primary} has no replay either"
            mentions.append(f"{op_name} (an alternate of {primary}; {why})")
    if not mentions:
        return f"{base}, and {OP_MAPPING_FILE} names it in no mapping"
    return f"{base}; {OP_MAPPING_FILE} names it in " + ", ".join(mentions)
