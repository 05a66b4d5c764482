"""Loading and checking the grid routing config (``config.yaml``).

The config maps each kernel type to a generator and the shape patterns its rows follow; see the
comments at the top of the shipped ``config.yaml`` for the format.  It is read with
``yaml.safe_load`` and checked completely before anything is generated: unknown keys, unknown
generators, bad dtypes and malformed or unknown-name expressions are reported with the key path
(``kernels.MatMulV2.patterns[0].inputs[1][0]``) and, for expressions, the character position.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.kernel_types import validate_kernel_type
from perf_plugin.database.schema import INPUT_STRIDES, OP_ARGUMENTS
from perf_plugin.database.signature import normalise_dtype
from perf_plugin.grid.evaluator import Expression, ExpressionError, compile_expression
from perf_plugin.grid.generators import GENERATORS, Generator
from perf_plugin.grid.models import EXPRESSION_NAMES
from perf_plugin.replay.aten_call import slots_used
from perf_plugin.replay.tensors import DTYPES

DEFAULT_CONFIG = Path(__file__).with_name("config.yaml")
DEFAULT_OP_STATE = "dynamic"
DEFAULT_ACCELERATOR_CORE = "AI_CORE"
DEFAULT_DTYPE = "BF16"

_TOP_KEYS = {"version", "grids", "kernels"}
_ROUTE_KEYS = {"generator", "options", "patterns", "accelerator_core", "op_state"}
_PATTERN_KEYS = {
    "name", "over", "let", "where", "inputs", "input_slots", "outputs", "output_slots",
    "dtype", "workspace", "columns", "strides", "arguments",
}
_ARGUMENT_KEYS = {"overload", "args", "operator"}


@dataclass(frozen=True)
class SlotSpec:
    """One tensor slot of a pattern: dims to evaluate (None: no shape) and a normalised dtype.

    ``dims is None and dtype == ""`` is an undefined optional slot (``DT_UNDEFINED``);
    ``dims is None`` with a dtype is a 0-d / host scalar slot (``"4096;"`` with ``FLOAT;FLOAT``).
    """

    dims: tuple[Expression, ...] | None
    dtype: str

    @property
    def present(self) -> bool:
        return self.dims is not None

    @property
    def rank(self) -> int | None:
        return None if self.dims is None else len(self.dims)


UNDEFINED_SLOT = SlotSpec(None, "")


@dataclass(frozen=True)
class Pattern:
    name: str
    key: str  # config key path, for messages
    over: tuple[tuple[str, tuple[int, ...]], ...]
    let: tuple[tuple[str, Expression], ...]
    where: tuple[Expression, ...]
    inputs: tuple[SlotSpec, ...]
    outputs: tuple[SlotSpec, ...]
    workspace: Expression | None
    columns: tuple[tuple[str, Expression], ...]
    # Per input slot, the strides of a tensor the kernel reads as a strided view (None: row-major,
    # or no tensor); None when the pattern gives none (``Input Strides``).
    strides: tuple[tuple[Expression, ...] | None, ...] | None = None
    # The ``Op Arguments`` cell of rows replayed through ``torch.ops.aten`` ("" for none).
    arguments: str = ""

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    @property
    def detail_columns(self) -> tuple[str, ...]:
        """The detail columns (part of a row's signature) this pattern writes."""
        return ((INPUT_STRIDES,) if self.strides is not None else ()) + ((OP_ARGUMENTS,) if self.arguments else ())


@dataclass(frozen=True)
class KernelRoute:
    kernel_type: str
    generator: Generator
    options: Mapping[str, Any]
    patterns: tuple[Pattern, ...]
    op_state: str
    accelerator_core: str

    @property
    def column_names(self) -> tuple[str, ...]:
        names: list[str] = []
        for pattern in self.patterns:
            names += [n for n in pattern.column_names if n not in names]
        return tuple(names)

    @property
    def written_columns(self) -> tuple[str, ...]:
        """``column_names``, the patterns' detail columns and the generator's own (``Input Values``);
        the detail columns are in the signature already."""
        names = list(self.column_names)
        for name in [c for p in self.patterns for c in p.detail_columns] + list(self.generator.row_columns(self.options)):
            if name not in names:
                names.append(name)
        return tuple(names)


@dataclass(frozen=True)
class GridConfig:
    path: Path
    grids: Mapping[str, tuple[int, ...]]
    kernels: Mapping[str, KernelRoute]


class _Loader:
    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, key: str, message: str) -> DatabaseError:
        return DatabaseError(f"{key}: {message}" if key else message, path=self.path)

    def mapping(self, value: Any, key: str, allowed: set[str] | None = None) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(key, f"expected a mapping, got {type(value).__name__}")
        if allowed is not None:
            unknown = sorted(str(k) for k in value if k not in allowed)
            if unknown:
                raise self.error(key, f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")
        return value

    def expression(self, value: Any, key: str, names: set[str]) -> Expression:
        try:
            return compile_expression(value, names)
        except ExpressionError as exc:
            message = f"malformed expression {value!r}: {exc.message} at character {exc.position}"
            raise self.error(key, message) from None

    def dtype(self, value: Any, key: str) -> str:
        token = normalise_dtype(str(value))
        if token not in DTYPES:
            raise self.error(key, f"unknown dtype {value!r} (known: {', '.join(sorted(DTYPES))})")
        return token

    # ------------------------------------------------------------------------------------
    def load(self) -> GridConfig:
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DatabaseError(f"cannot read grid config: {exc.strerror}", path=self.path) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise DatabaseError(f"not valid YAML{where}: {getattr(exc, 'problem', exc)}", path=self.path) from None
        top = self.mapping(data, "", _TOP_KEYS)
        grids = self.grids(top.get("grids"))
        kernels_raw = self.mapping(top.get("kernels"), "kernels")
        if not kernels_raw:
            raise self.error("kernels", "no kernel type is routed")
        kernels = {}
        for kernel_type, route in kernels_raw.items():
            key = f"kernels.{kernel_type}"
            try:
                validate_kernel_type(str(kernel_type))
            except DatabaseError as exc:
                raise self.error(key, exc.reason) from None
            kernels[str(kernel_type)] = self.route(str(kernel_type), route, key, grids)
        return GridConfig(self.path, grids, kernels)

    def grids(self, value: Any) -> dict[str, tuple[int, ...]]:
        grids: dict[str, tuple[int, ...]] = {}
        for name, values in self.mapping(value, "grids").items():
            grids[str(name)] = self.int_list(values, f"grids.{name}")
        return grids

    def int_list(self, values: Any, key: str) -> tuple[int, ...]:
        if not isinstance(values, list) or not values:
            raise self.error(key, "expected a non-empty list of positive integers")
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise self.error(f"{key}[{i}]", f"expected a positive integer, got {v!r}")
        return tuple(values)

    def route(self, kernel_type: str, value: Any, key: str, grids: Mapping[str, tuple[int, ...]]) -> KernelRoute:
        raw = self.mapping(value, key, _ROUTE_KEYS)
        name = raw.get("generator")
        if name not in GENERATORS:
            raise self.error(f"{key}.generator", f"unknown generator {name!r} (known: {', '.join(sorted(GENERATORS))})")
        generator = GENERATORS[name]
        try:
            options = generator.resolve_options(self.mapping(raw.get("options"), f"{key}.options"), grids)
        except ValueError as exc:
            raise self.error(f"{key}.options", str(exc)) from None
        patterns_raw = raw.get("patterns")
        if not isinstance(patterns_raw, list) or not patterns_raw:
            raise self.error(f"{key}.patterns", "expected a non-empty list of patterns")
        base_names = set(EXPRESSION_NAMES) | set(generator.variables(options))
        patterns = tuple(
            self.pattern(p, f"{key}.patterns[{i}]", grids, base_names) for i, p in enumerate(patterns_raw)
        )
        return KernelRoute(
            kernel_type=kernel_type,
            generator=generator,
            options=options,
            patterns=patterns,
            op_state=str(raw.get("op_state", DEFAULT_OP_STATE)),
            accelerator_core=str(raw.get("accelerator_core", DEFAULT_ACCELERATOR_CORE)),
        )

    def pattern(self, value: Any, key: str, grids: Mapping[str, tuple[int, ...]], base: set[str]) -> Pattern:
        raw = self.mapping(value, key, _PATTERN_KEYS)
        names = set(base)
        over = []
        for var, source in self.mapping(raw.get("over"), f"{key}.over").items():
            if isinstance(source, str):
                if source not in grids:
                    known = ", ".join(sorted(grids))
                    raise self.error(f"{key}.over.{var}", f"unknown grid {source!r} (grids: {known})")
                values = grids[source]
            else:
                values = self.int_list(source, f"{key}.over.{var}")
            over.append((str(var), values))
            names.add(str(var))
        let = []
        for var, text in self.mapping(raw.get("let"), f"{key}.let").items():
            let.append((str(var), self.expression(text, f"{key}.let.{var}", names)))
            names.add(str(var))
        where_raw = raw.get("where", [])
        where_list = [where_raw] if isinstance(where_raw, str) else where_raw
        if not isinstance(where_list, list):
            raise self.error(f"{key}.where", "expected a condition or a list of conditions")
        where = tuple(self.expression(t, f"{key}.where[{i}]", names) for i, t in enumerate(where_list))
        dtype = self.dtype(raw.get("dtype", DEFAULT_DTYPE), f"{key}.dtype")
        inputs = self.slots(
            raw.get("inputs"), raw.get("input_slots"), f"{key}.inputs", f"{key}.input_slots", names, dtype
        )
        outputs = self.slots(
            raw.get("outputs"), raw.get("output_slots"), f"{key}.outputs", f"{key}.output_slots", names, dtype
        )
        if not any(s.present for s in outputs):
            raise self.error(f"{key}.outputs", "a pattern needs at least one output with a shape")
        workspace = raw.get("workspace")
        columns = tuple(
            (str(col), self.expression(text, f"{key}.columns.{col}", names))
            for col, text in self.mapping(raw.get("columns"), f"{key}.columns").items()
        )
        return Pattern(
            name=str(raw.get("name", key)),
            key=key,
            over=tuple(over),
            let=tuple(let),
            where=where,
            inputs=inputs,
            outputs=outputs,
            workspace=None if workspace is None else self.expression(workspace, f"{key}.workspace", names),
            columns=columns,
            strides=None if raw.get("strides") is None else self.strides(raw["strides"], f"{key}.strides", names, inputs),
            arguments="" if raw.get("arguments") is None else self.arguments(raw["arguments"], f"{key}.arguments", inputs),
        )

    def strides(
        self, value: Any, key: str, names: set[str], inputs: tuple[SlotSpec, ...]
    ) -> tuple[tuple[Expression, ...] | None, ...]:
        """Per input slot (a list, or a mapping of slot index to strides): ``~`` or one stride
        expression per dim of the slot's shape."""
        if isinstance(value, Mapping):
            entries = dict(value)
        elif isinstance(value, list):
            entries = dict(enumerate(value))
        else:
            raise self.error(key, "expected a list of per-slot strides (or a mapping of slot index to strides)")
        strides: list[tuple[Expression, ...] | None] = [None] * len(inputs)
        for index, spec in entries.items():
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(inputs):
                raise self.error(key, f"slot {index!r} is not an input slot (the pattern has {len(inputs)})")
            if spec is None:
                continue
            if not isinstance(spec, list) or len(spec) != inputs[index].rank:
                raise self.error(f"{key}[{index}]", f"expected one stride per dim of input slot {index} "
                                 f"({inputs[index].rank or 0} dims), got {spec!r}")
            strides[index] = tuple(self.expression(d, f"{key}[{index}][{i}]", names) for i, d in enumerate(spec))
        return tuple(strides)

    def arguments(self, value: Any, key: str, inputs: tuple[SlotSpec, ...]) -> str:
        """The ``Op Arguments`` cell in ingest's form: compact JSON of overload, args (operator)."""
        raw = self.mapping(value, key, _ARGUMENT_KEYS)
        args = raw.get("args")
        if not isinstance(raw.get("overload", ""), str) or not isinstance(args, list):
            raise self.error(key, "expected {overload: NAME, args: [...]} ({tensor: k} for input slot k)")
        try:
            used = slots_used(args)
        except (TypeError, ValueError):
            raise self.error(f"{key}.args", "a {tensor: k} argument needs an integer slot index k") from None
        for slot in used:
            if not (0 <= slot < len(inputs) and inputs[slot].dtype):
                raise self.error(f"{key}.args", f"input slot {slot} is not a tensor slot of the pattern")
        document: dict[str, Any] = {"overload": raw.get("overload", ""), "args": args}
        if raw.get("operator"):
            document["operator"] = raw["operator"]
        try:
            return json.dumps(document, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise self.error(key, f"not writable as JSON: {exc}") from None

    def slots(
        self, value: Any, count: Any, key: str, count_key: str, names: set[str], dtype: str
    ) -> tuple[SlotSpec, ...]:
        if isinstance(value, Mapping):
            # {index: slot}: a kernel with many optional slots (FusedInferAttentionScore has 31)
            indexed = {}
            for index, spec in value.items():
                if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                    raise self.error(key, f"slot index {index!r} is not a non-negative integer")
                indexed[index] = self.slot(spec, f"{key}[{index}]", names, dtype)
            width = max(indexed) + 1
            if count is not None:
                if isinstance(count, bool) or not isinstance(count, int) or count < width:
                    raise self.error(count_key, f"expected an integer >= {width}, got {count!r}")
                width = count
            return tuple(indexed.get(i, UNDEFINED_SLOT) for i in range(width))
        if not isinstance(value, list) or not value:
            raise self.error(key, "expected a list of slots (or a mapping of slot index to slot)")
        slots = [self.slot(spec, f"{key}[{i}]", names, dtype) for i, spec in enumerate(value)]
        if count is not None:
            if isinstance(count, bool) or not isinstance(count, int) or count < len(slots):
                raise self.error(count_key, f"expected an integer >= {len(slots)}, got {count!r}")
            slots += [UNDEFINED_SLOT] * (count - len(slots))
        return tuple(slots)

    def slot(self, value: Any, key: str, names: set[str], dtype: str) -> SlotSpec:
        if value is None:
            return UNDEFINED_SLOT
        if isinstance(value, list):
            return SlotSpec(self.dims(value, key, names), dtype)
        raw = self.mapping(value, key, {"shape", "dtype"})
        slot_dtype = self.dtype(raw["dtype"], f"{key}.dtype") if "dtype" in raw else dtype
        shape = raw.get("shape")
        if shape is None:
            if "dtype" not in raw:
                raise self.error(key, "a slot mapping needs a shape, a dtype, or both")
            return SlotSpec(None, slot_dtype)
        if not isinstance(shape, list):
            raise self.error(f"{key}.shape", "expected a list of dimension expressions")
        return SlotSpec(self.dims(shape, f"{key}.shape", names), slot_dtype)

    def dims(self, value: Sequence[Any], key: str, names: set[str]) -> tuple[Expression, ...]:
        if not value:
            raise self.error(key, "a shape needs at least one dimension (use {dtype: ...} for a scalar slot)")
        return tuple(self.expression(d, f"{key}[{i}]", names) for i, d in enumerate(value))


def load_config(path: str | Path | None = None) -> GridConfig:
    """Read and check a routing config (the shipped ``config.yaml`` by default)."""
    return _Loader(Path(path) if path is not None else DEFAULT_CONFIG).load()
