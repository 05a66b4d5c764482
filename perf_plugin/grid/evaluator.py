"""A small, safe evaluator for the shape expressions of grid configs.

An expression such as ``(heads_per_rank + 2 * kv_heads_per_rank) * head_dim`` is parsed with
``ast`` in ``eval`` mode, checked node by node, and compiled into nested closures; nothing ever
reaches ``eval`` or ``exec``.  Accepted:

* integer and float constants, and names (model parameters and grid variables);
* binary ``+ - * / // %`` and unary ``-`` ``+``;
* calls of ``ceil_div(a, b)``, ``min(a, b, ...)`` and ``max(a, b, ...)`` with positional
  arguments;
* comparisons ``== != < <= > >=`` (chains allowed) and ``and`` / ``or`` / ``not``, for the
  ``where`` conditions of a pattern.

Everything else (attribute access, subscripts, ``**``, strings, keyword arguments, lambdas,
comprehensions...) is rejected when the config is loaded, with the 1-based character position
of the offending part, so a typo is reported before any row is generated.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

Number = int | float
Env = Mapping[str, Number]
_Fn = Callable[[Env], Number]


class ExpressionError(Exception):
    """A malformed expression; ``position`` is the 1-based character it concerns."""

    def __init__(self, message: str, position: int) -> None:
        self.message = message
        self.position = position
        super().__init__(f"{message} at character {position}")


class EvaluationError(Exception):
    """An expression that parsed but cannot be evaluated for one set of variables."""


def ceil_div(a: Number, b: Number) -> int:
    if b == 0:
        raise ZeroDivisionError("ceil_div by zero")
    return int(-(-a // b))


_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Number, Number], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_SYMBOLS: dict[type, str] = {
    ast.Pow: "'**'",
    ast.MatMult: "'@'",
    ast.BitAnd: "'&'",
    ast.BitOr: "'|'",
    ast.BitXor: "'^'",
    ast.LShift: "'<<'",
    ast.RShift: "'>>'",
    ast.Invert: "'~'",
    ast.Is: "'is'",
    ast.IsNot: "'is not'",
    ast.In: "'in'",
    ast.NotIn: "'not in'",
}
FUNCTIONS: dict[str, Callable[..., Number]] = {"ceil_div": ceil_div, "min": min, "max": max}


@dataclass(frozen=True)
class Expression:
    """A compiled expression; call it with a mapping of variable values."""

    text: str
    names: frozenset[str]
    # The compiled closure; it raises KeyError / ZeroDivisionError as they come (hot loops
    # call it directly and handle both once per row).
    fn: _Fn = field(repr=False, compare=False)

    def __call__(self, env: Env) -> Number:
        try:
            return self.fn(env)
        except KeyError as exc:
            raise EvaluationError(f"{exc.args[0]!r} is not defined here") from None
        except ZeroDivisionError:
            raise EvaluationError(f"division by zero in {self.text!r}") from None


class _Compiler:
    """Walks the allowed nodes of one expression and builds its closure."""

    def __init__(self, text: str, line_starts: list[int], allowed_names: Collection[str] | None) -> None:
        self.text = text
        self.line_starts = line_starts
        self.allowed_names = allowed_names
        self.names: set[str] = set()

    def position(self, node: ast.AST) -> int:
        line = getattr(node, "lineno", 1)
        column = getattr(node, "col_offset", 0)
        return self.line_starts[line - 1] + column + 1

    def fail(self, node: ast.AST, message: str) -> ExpressionError:
        return ExpressionError(message, self.position(node))

    def operator_position(self, left: ast.AST) -> int:
        """Position of the operator that follows the operand ``left``."""
        line = getattr(left, "end_lineno", 1) or 1
        index = self.line_starts[line - 1] + (getattr(left, "end_col_offset", 0) or 0)
        while index < len(self.text) and self.text[index] in " \t\n()":
            index += 1
        return index + 1

    def compile(self, node: ast.AST) -> _Fn:
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.fail(node, f"constant {value!r} is not a number")
            return lambda env: value
        if isinstance(node, ast.Name):
            name = node.id
            if name in FUNCTIONS:
                raise self.fail(node, f"{name!r} is a function: call it as {name}(...)")
            if self.allowed_names is not None and name not in self.allowed_names:
                raise self.fail(node, f"unknown name {name!r}")
            self.names.add(name)
            return lambda env: env[name]
        if isinstance(node, ast.BinOp):
            op = _BINARY.get(type(node.op))
            if op is None:
                symbol = _SYMBOLS.get(type(node.op), type(node.op).__name__)
                raise ExpressionError(f"operator {symbol} is not allowed", self.operator_position(node.left))
            left, right = self.compile(node.left), self.compile(node.right)
            return lambda env: op(left(env), right(env))
        if isinstance(node, ast.UnaryOp):
            operand = self.compile(node.operand)
            if isinstance(node.op, ast.USub):
                return lambda env: -operand(env)
            if isinstance(node.op, ast.UAdd):
                return operand
            if isinstance(node.op, ast.Not):
                return lambda env: not operand(env)
            raise self.fail(node, f"operator {_SYMBOLS.get(type(node.op), type(node.op).__name__)} is not allowed")
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.BoolOp):
            parts = [self.compile(value) for value in node.values]
            if isinstance(node.op, ast.And):
                return lambda env: all(part(env) for part in parts)
            return lambda env: any(part(env) for part in parts)
        raise self.fail(node, f"{_describe(node)} is not allowed in a shape expression")

    def _call(self, node: ast.Call) -> _Fn:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise self.fail(node, f"only {', '.join(FUNCTIONS)} can be called")
        name = node.func.id
        if node.keywords:
            raise self.fail(node.keywords[0], f"{name}() takes positional arguments only")
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise self.fail(arg, f"{name}() takes plain arguments only")
        if name == "ceil_div" and len(node.args) != 2:
            raise self.fail(node, f"ceil_div() takes 2 arguments, got {len(node.args)}")
        if name in ("min", "max") and len(node.args) < 2:
            raise self.fail(node, f"{name}() takes at least 2 arguments, got {len(node.args)}")
        function = FUNCTIONS[name]
        args = [self.compile(arg) for arg in node.args]
        return lambda env: function(*(arg(env) for arg in args))

    def _compare(self, node: ast.Compare) -> _Fn:
        ops = []
        for op, left in zip(node.ops, [node.left] + node.comparators):
            compare = _COMPARE.get(type(op))
            if compare is None:
                symbol = _SYMBOLS.get(type(op), type(op).__name__)
                raise ExpressionError(f"comparison {symbol} is not allowed", self.operator_position(left))
            ops.append(compare)
        operands = [self.compile(node.left)] + [self.compile(c) for c in node.comparators]

        def evaluate(env: Env) -> bool:
            left = operands[0](env)
            for compare, right_fn in zip(ops, operands[1:]):
                right = right_fn(env)
                if not compare(left, right):
                    return False
                left = right
            return True

        return evaluate


def _describe(node: ast.AST) -> str:
    names = {
        ast.Attribute: "attribute access",
        ast.Subscript: "subscripting",
        ast.Lambda: "a lambda",
        ast.IfExp: "a conditional expression",
        ast.List: "a list",
        ast.Tuple: "a tuple",
        ast.Dict: "a dict",
        ast.Set: "a set",
        ast.ListComp: "a comprehension",
        ast.GeneratorExp: "a comprehension",
        ast.NamedExpr: "an assignment expression",
        ast.JoinedStr: "a string",
    }
    return names.get(type(node), type(node).__name__)


def compile_expression(text: str | int | float, allowed_names: Collection[str] | None = None) -> Expression:
    """Compile ``text`` (or a bare number) into an Expression; raises ExpressionError.

    ``allowed_names``, when given, is the set of names the expression may use: an unknown name
    is reported at load time with its position rather than when a row is generated.
    """
    if isinstance(text, bool):
        raise ExpressionError(f"{text!r} is not a number", 1)
    if isinstance(text, (int, float)):
        value = text
        return Expression(str(text), frozenset(), lambda env: value)
    if not isinstance(text, str):
        raise ExpressionError(f"expected an expression, got {type(text).__name__}", 1)
    stripped = text.lstrip()
    lead = len(text) - len(stripped)
    body = stripped.rstrip()
    if not body:
        raise ExpressionError("empty expression", 1)
    try:
        tree = ast.parse(body, mode="eval")
    except SyntaxError as exc:
        if not exc.offset:
            # the parser ran out of input: the expression ends too early ("m +")
            raise ExpressionError("incomplete expression", lead + len(body) + 1) from None
        line_starts = _line_starts(body)
        line = min(max(1, exc.lineno or 1), len(line_starts))
        offset = line_starts[line - 1] + exc.offset
        raise ExpressionError(exc.msg, lead + min(offset, len(body) + 1)) from None
    compiler = _Compiler(body, _line_starts(body), allowed_names)
    try:
        fn = compiler.compile(tree.body)
    except ExpressionError as exc:
        raise ExpressionError(exc.message, exc.position + lead) from None
    return Expression(text, frozenset(compiler.names), fn)


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for index, char in enumerate(text):
        if char == "\n":
            starts.append(index + 1)
    return starts
