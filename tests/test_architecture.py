"""The package's shape, checked from its source: imports run down the layers, modules and
functions stay small enough to read, and only ``backends/`` names a backend.

The layers, bottom first (a module may import its own layer and the ones below):

0. ``database``, ``results``, ``usage``: the file contracts and the values that travel;
1. ``trace``, ``capture``, ``backends``: trace records and what a model run adds to them,
   what differs between devices;
2. ``replay``: kernel types and their replays;
3. ``options``, ``ingest``, ``profiling``, ``grid``, ``report``, ``lookup``: what reads and writes the database;
4. ``run``, ``comm``, ``candidates``: the session machinery, and candidate kernels judged in it;
5. ``plugin``, ``hookspecs``, ``cli``: the entry points.

The ``python -m perf_plugin.ingest`` and ``python -m perf_plugin.grid`` shims call the CLI, the one
arrow allowed upwards: they are entry points themselves.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "perf_plugin"
LAYER = {
    "database": 0, "results": 0, "usage": 0, "__init__": 0,
    "trace": 1, "capture": 1, "backends": 1,
    "replay": 2,
    "options": 3, "ingest": 3, "profiling": 3, "grid": 3, "report": 3, "lookup": 3,
    "run": 4, "comm": 4, "candidates": 4,
    "plugin": 5, "hookspecs": 5, "cli": 5,
}
ENTRY_SHIMS = {"perf_plugin/ingest/__main__.py", "perf_plugin/grid/__main__.py"}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sources() -> list[tuple[str, ast.Module, str]]:
    return [
        (str(path.relative_to(PACKAGE.parent)), ast.parse(path.read_text()), path.read_text())
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _unit(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_unit_of_the_package_has_a_layer() -> None:
    units = {_unit(".".join(Path(name).with_suffix("").parts)) for name, _, _ in _sources()}
    assert units <= set(LAYER), f"give these a layer: {sorted(units - set(LAYER))}"


def test_no_import_runs_up_the_layers() -> None:
    upward = []
    for name, tree, _ in _sources():
        if name in ENTRY_SHIMS:
            continue
        source_unit = _unit(".".join(Path(name).with_suffix("").parts))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.module or not node.module.startswith("perf_plugin"):
                continue
            targets = [node.module] if node.module != "perf_plugin" else [f"perf_plugin.{a.name}" for a in node.names]
            for target in targets:
                if LAYER[source_unit] < LAYER.get(_unit(target), 0):
                    upward.append(f"{name}:{node.lineno} imports {target}")
    assert upward == []


def test_modules_and_functions_stay_small() -> None:
    long_modules = [f"{name}: {len(text.splitlines())}" for name, _, text in _sources()
                    if len(text.splitlines()) > MAX_MODULE_LINES]
    long_functions = [
        f"{name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}"
        for name, tree, _ in _sources()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long_modules == [] and long_functions == []


def test_only_backends_name_a_backend() -> None:
    """Outside ``backends/``, code asks a backend what it needs; replays may still test a tensor's
    torch device type (``x.device.type == "cuda"``), which is torch's name for where the tensor
    lives and which of torch's kernels exist there."""
    spelled = re.compile(r"""(?:==|!=|\bin\b|=)\s*\(?\s*["'](?:cuda|npu)["']""")
    found = [
        f"{name}:{number}: {line.strip()}"
        for name, _, text in _sources()
        if not name.startswith(("perf_plugin/backends/", "perf_plugin/replay/"))
        for number, line in enumerate(text.splitlines(), 1)
        if spelled.search(line)
    ]
    assert found == []
