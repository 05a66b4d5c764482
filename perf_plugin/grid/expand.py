"""Expanding a pattern over its base environments into concrete slot shapes.

For every base environment, every combination of the pattern's ``over`` grids is bound, the
``let`` values are derived in order, the ``where`` conditions filter, and each slot's dims are
evaluated, and the input strides where the pattern gives them.  A candidate whose dims do not
come out as positive integers (``heads / tp`` not whole, a zero-width slot, a division by zero, a
name the environment lacks such as a model parameter in the generic GEMM grid), or whose strides
are not whole numbers >= 0 (0: a broadcast view), is skipped and counted with its first reason,
never written.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from perf_plugin.database.schema import format_number
from perf_plugin.database.shapes import Shape
from perf_plugin.grid.config import Pattern, SlotSpec
from perf_plugin.grid.evaluator import EvaluationError, Expression, Number
from perf_plugin.grid.generators import BaseEnv


@dataclass(frozen=True)
class Candidate:
    """One generated row before it is written: slot shapes and extra column values."""

    model: str
    inputs: tuple[Shape | None, ...]
    outputs: tuple[Shape | None, ...]
    columns: tuple[str, ...]  # aligned with Pattern.columns
    workspace: int
    strides: tuple[Shape | None, ...] | None = None  # per input slot, where the pattern gives them


@dataclass
class ExpandStats:
    """How many combinations were evaluated and why some were skipped."""

    evaluated: int = 0
    filtered: int = 0  # rejected by a ``where`` condition (not a problem)
    skipped: Counter[str] = field(default_factory=Counter)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


class _Skip(Exception):
    pass


def _dim(value: Number, text: str, least: int = 1) -> int:
    if isinstance(value, float):
        if not value.is_integer():
            raise _Skip(f"{text!r} is not a whole number")
        value = int(value)
    if value < least:
        raise _Skip(f"{text!r} is {value}, not a positive size" if least else f"{text!r} is {value}, not a stride")
    return value


_SlotPlan = tuple[tuple[tuple[Callable[[dict[str, Number]], Number], str], ...] | None, ...]


def _plan(slots: tuple[SlotSpec, ...]) -> _SlotPlan:
    """Per slot: the compiled dim closures with their texts (None for a slot without shape)."""
    return tuple(None if s.dims is None else tuple((e.fn, e.text) for e in s.dims) for s in slots)


def _stride_plan(strides: tuple[tuple[Expression, ...] | None, ...]) -> _SlotPlan:
    return tuple(None if s is None else tuple((e.fn, e.text) for e in s) for s in strides)


def _shapes(plan: _SlotPlan, env: dict[str, Number], least: int = 1) -> tuple[Shape | None, ...]:
    """The slots' dims (``least`` 1), or strides (``least`` 0), evaluated in ``env``."""
    shapes: list[Shape | None] = []
    for dims in plan:
        if dims is None:
            shapes.append(None)
            continue
        shape = []
        for fn, text in dims:
            value = fn(env)
            if type(value) is not int or value < least:
                value = _dim(value, text, least)
            shape.append(value)
        shapes.append(tuple(shape))
    return tuple(shapes)


def _column_text(value: Number) -> str:
    if isinstance(value, float) and not value.is_integer():
        return format_number(value)
    return str(int(value))


def expand(pattern: Pattern, base_envs: Iterable[BaseEnv], stats: ExpandStats) -> Iterator[Candidate]:
    """Candidates of ``pattern`` over ``base_envs``, in a deterministic order."""
    names = [name for name, _ in pattern.over]
    grids = [values for _, values in pattern.over]
    # conditions that do not read a ``let`` value run first, so a ``let`` that only makes sense
    # for some models (experts / ep) is never evaluated for the others
    derived = {name for name, _ in pattern.let}
    early = [c for c in pattern.where if not c.names & derived]
    late = [c for c in pattern.where if c.names & derived]
    inputs_plan, outputs_plan = _plan(pattern.inputs), _plan(pattern.outputs)
    strides_plan = None if pattern.strides is None else _stride_plan(pattern.strides)
    for model, base in base_envs:
        for combo in itertools.product(*grids):
            stats.evaluated += 1
            env: dict[str, Number] = dict(base)
            env.update(zip(names, combo))
            try:
                if not all(condition(env) for condition in early):
                    stats.filtered += 1
                    continue
                for name, expr in pattern.let:
                    env[name] = expr(env)
                if not all(condition(env) for condition in late):
                    stats.filtered += 1
                    continue
                inputs = _shapes(inputs_plan, env)
                outputs = _shapes(outputs_plan, env)
                strides = None if strides_plan is None else _shapes(strides_plan, env, least=0)
                columns = tuple(_column_text(expr(env)) for _, expr in pattern.columns)
                workspace = 0
                if pattern.workspace is not None:
                    value = pattern.workspace(env)
                    workspace = _dim(value, pattern.workspace.text) if value else 0
            except (_Skip, EvaluationError) as exc:
                stats.skipped[f"{pattern.key}: {exc}"] += 1
                continue
            except KeyError as exc:  # raised by a compiled dim closure
                stats.skipped[f"{pattern.key}: {exc.args[0]!r} is not defined here"] += 1
                continue
            except ZeroDivisionError:
                stats.skipped[f"{pattern.key}: division by zero"] += 1
                continue
            yield Candidate(model, inputs, outputs, columns, workspace, strides)
