"""Operator schemas as torch-npu registers them, parsed, and a call bound against them.

The fixture ``tests/fixtures/torch_npu/schemas.txt`` holds the schema strings of the real
torch-npu wheel (``reproduce/torch_npu_schemas.py`` extracts them; the file's first lines name
the wheel).  A schema reads ``name[.overload](Type arg[=default], ..., *, Type kwarg[=default]) ->
returns``; arguments after ``*`` are keyword-only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMAS = Path(__file__).parent / "fixtures" / "torch_npu" / "schemas.txt"
_HEAD = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?:\.(?P<overload>\w+))?\((?P<args>.*)\) -> (?P<returns>.+)$")
_ARG = re.compile(r"^(?P<type>(?:Tensor|int|float|bool|SymInt|Scalar|ScalarType|str|Layout|Device|MemoryFormat|"
                  r"Generator|Dimname|Storage|Stream|Any|Dict|Layout|c10)[\w\[\]\(\)!?|.]*)\s+(?P<name>[A-Za-z_]\w*)"
                  r"(?:=(?P<default>[^,]+))?$")


@dataclass(frozen=True)
class Param:
    name: str
    keyword_only: bool
    required: bool


@dataclass(frozen=True)
class Schema:
    name: str
    overload: str
    params: tuple[Param, ...]

    @property
    def positional(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if not p.keyword_only)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "([" 
        depth -= char in ")]"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def parse_schema(text: str) -> Schema | None:
    """The schema a string holds, None for anything else (a string of the binary that only looks like one)."""
    head = _HEAD.match(text.strip())
    if head is None:
        return None
    params, keyword_only = [], False
    for part in _split_top_level(head["args"]):
        if part == "*":
            keyword_only = True
            continue
        arg = _ARG.match(part)
        if arg is None:
            return None
        params.append(Param(arg["name"], keyword_only, arg["default"] is None))
    return Schema(head["name"], head["overload"] or "", tuple(params))


def load_schemas(path: Path = SCHEMAS) -> dict[str, list[Schema]]:
    """Operator name -> its overloads, from the fixture (``#`` lines are its provenance)."""
    found: dict[str, list[Schema]] = {}
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        schema = parse_schema(line)
        assert schema is not None, f"{path}: not a schema: {line}"
        found.setdefault(schema.name, []).append(schema)
    return found


def binding_error(schema: Schema, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why ``args``/``kwargs`` do not bind to ``schema`` (None when they do): too many positional
    arguments, an unknown keyword, an argument given twice, or a required one missing."""
    positional = schema.positional
    if len(args) > len(positional):
        return f"{len(args)} positional arguments, the schema takes {len(positional)}"
    names = {p.name for p in schema.params}
    given = {p.name for p in positional[: len(args)]}
    for key in kwargs:
        if key not in names:
            return f"no argument named {key!r}"
        if key in given:
            return f"{key!r} given positionally and by keyword"
    missing = [p.name for p in schema.params if p.required and p.name not in given and p.name not in kwargs]
    return f"required argument(s) {', '.join(missing)} missing" if missing else None
