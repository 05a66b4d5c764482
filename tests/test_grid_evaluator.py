"""The safe shape-expression evaluator of grid configs."""

from __future__ import annotations

import ast
import builtins

import pytest

from perf_plugin.grid.evaluator import EvaluationError, ExpressionError, compile_expression

ENV = {"hidden": 5120, "heads": 64, "kv_heads": 8, "head_dim": 128, "tp": 16, "m": 7, "x": 10, "y": 4}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hidden", 5120),
        ("(heads // tp + 2 * max(1, kv_heads // tp)) * head_dim", (4 + 2 * 1) * 128),
        ("heads * head_dim // tp", 512),
        ("x / y", 2.5),
        ("x // y", 2),
        ("x % y", 2),
        ("-x + +y", -6),
        ("ceil_div(x, y)", 3),
        ("ceil_div(8, y)", 2),
        ("min(x, y, 3)", 3),
        ("max(x, y)", 10),
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("x - y - 1", 5),
        ("1.5 * y", 6.0),
        (7, 7),
        ("  m * 2  ", 14),
    ],
)
def test_arithmetic(text: str | int, expected: float) -> None:
    value = compile_expression(text)(ENV)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("m <= x", True),
        ("m > x", False),
        ("y < m < x", True),
        ("y < x < m", False),
        ("m == 7 and x != 10", False),
        ("m == 7 or x != 10", True),
        ("not m == 7", False),
        ("tp >= kv_heads", True),
    ],
)
def test_conditions(text: str, expected: bool) -> None:
    assert compile_expression(text)(ENV) is expected


def test_names_are_collected() -> None:
    assert compile_expression("ceil_div(x, y) + min(m, heads)").names == {"x", "y", "m", "heads"}


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("m +* x", "invalid syntax", 4),
        ("m + ", "incomplete expression", 4),
        ("  m +* x", "invalid syntax", 6),
        ("(m + x", "'(' was never closed", 1),
        ("m + x)", "unmatched ')'", 6),
        ("m.real", "attribute access is not allowed", 1),
        ("m[0]", "subscripting is not allowed", 1),
        ("m ** 2", "operator '**' is not allowed", 3),
        ("(m + x) ** 2", "operator '**' is not allowed", 9),
        ("m & x", "operator '&' is not allowed", 3),
        ("m in x", "comparison 'in' is not allowed", 3),
        ("'m'", "constant 'm' is not a number", 1),
        ("True", "constant True is not a number", 1),
        ("__import__('os')", "only ceil_div, min, max can be called", 1),
        ("m.__class__", "attribute access is not allowed", 1),
        ("lambda: 1", "a lambda is not allowed", 1),
        ("x if m else y", "a conditional expression is not allowed", 1),
        ("[m, x]", "a list is not allowed", 1),
        ("min(m, key=x)", "min() takes positional arguments only", 8),
        ("max(*m)", "max() takes plain arguments only", 5),
        ("max(m)", "max() takes at least 2 arguments, got 1", 1),
        ("ceil_div(m)", "ceil_div() takes 2 arguments, got 1", 1),
        ("m + min", "'min' is a function", 5),
        ("m + hiden", "unknown name 'hiden'", 5),
        ("", "empty expression", 1),
    ],
)
def test_rejected_with_position(text: str, message: str, position: int) -> None:
    with pytest.raises(ExpressionError) as info:
        compile_expression(text, allowed_names=set(ENV))
    assert info.value.message.startswith(message)
    assert info.value.position == position
    assert str(info.value) == f"{info.value.message} at character {position}"


def test_evaluation_errors_are_reported_not_raised_raw() -> None:
    with pytest.raises(EvaluationError, match="'missing' is not defined here"):
        compile_expression("missing * 2")(ENV)
    with pytest.raises(EvaluationError, match="division by zero"):
        compile_expression("x // (y - 4)")(ENV)
    with pytest.raises(EvaluationError, match="division by zero"):
        compile_expression("ceil_div(x, 0)")(ENV)


def test_never_uses_eval_or_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only ``ast.parse`` (compile with PyCF_ONLY_AST) may run; no code object is ever built."""
    real_compile = builtins.compile
    calls: list[int] = []

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("eval/exec must not be used")

    def ast_only_compile(source: object, filename: object, mode: str, flags: int = 0, **kw: object) -> object:
        calls.append(flags)
        if not flags & ast.PyCF_ONLY_AST:
            raise AssertionError("compile() to a code object must not be used")
        return real_compile(source, filename, mode, flags, **kw)  # type: ignore[call-overload]

    with monkeypatch.context() as patch:
        patch.setattr(builtins, "eval", forbidden)
        patch.setattr(builtins, "exec", forbidden)
        patch.setattr(builtins, "compile", ast_only_compile)
        expression = compile_expression("ceil_div(hidden, tp) * 2 + (m > 3)")
        value = expression(ENV)
    assert value == 5120 // 16 * 2 + 1
    assert calls and all(flags & ast.PyCF_ONLY_AST for flags in calls)
