"""Small arithmetic expressions for search-space bounds and derived metrics.

    Expr("model.loops - 1").evaluate({"model.loops": 6})                       -> 5
    Expr("eval/mean_segments * model.loops").evaluate({...})                   -> compute per row

Names are dotted config keys or metric names (``eval/mean_segments``); write division with
spaces around ``/`` so it is not read as part of a name. Allowed: numbers, names, ``+ - * / //
%``, unary minus, ``min``, ``max``, ``round``, ``int``. Nothing else is evaluated (no attribute
access, no calls of other functions), so a YAML file cannot run code. Every way an expression can
fail (bad syntax, a call with the wrong number of arguments, a number too large, nesting deeper
than ``MAX_DEPTH``, a division by zero) is a ``ConfigError`` naming its key and its text.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping

from urm_ray.errors import ConfigError
from urm_ray.typed import excerpt

# a dotted name, optionally with /-separated parts (metric names such as eval/exact_accuracy)
_NAME = re.compile(r"(?<![\w.])[A-Za-z_][\w.]*(?:/[A-Za-z_][\w.]*)*")
_FUNCTIONS: dict[str, Callable[..., float]] = {"min": min, "max": max, "round": round, "int": int}
# (fewest, most) positional arguments; min and max of one number would iterate over it
_ARITY: dict[str, tuple[int, int | None]] = {"min": (2, None), "max": (2, None), "round": (1, 2), "int": (1, 1)}
MAX_DEPTH = 50  # operators and calls nested in one another: a bound needs a handful
_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}


class Expr:
    """A parsed expression; ``names`` are the variables it reads. ``key`` (e.g.
    ``model.truncation.high``) is where it was written, for error messages."""

    def __init__(self, text: str, key: str = "") -> None:
        self.text = text
        self.key = key
        self._slots: dict[str, str] = {}  # placeholder identifier -> original name
        source = _NAME.sub(self._placeholder, text)
        try:
            self._tree = ast.parse(source, mode="eval").body
        except SyntaxError as err:
            raise self._error(f"not valid arithmetic ({err.msg})") from None
        except (RecursionError, MemoryError):  # the parser's own stack, on thousands of operators
            raise self._error(f"nested deeper than {MAX_DEPTH} operators or calls") from None
        self._check(self._tree, 0)
        self.names = frozenset(self._slots.values())

    def _error(self, problem: str) -> ConfigError:
        where = f"{self.key}=" if self.key else "expression "
        return ConfigError(f"{where}{excerpt(self.text)}: {problem}")

    def _placeholder(self, match: re.Match[str]) -> str:
        name = match.group(0)
        if name in _FUNCTIONS:
            return name
        slot = f"_v{len(self._slots)}"
        self._slots[slot] = name
        return slot

    def _check(self, node: ast.AST, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self._error(f"nested deeper than {MAX_DEPTH} operators or calls")
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            if not math.isfinite(node.value):
                raise self._error("holds a number too large for a float (it reads as inf)")
            return
        if isinstance(node, ast.Name) and node.id in self._slots:
            return
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            self._check(node.left, depth + 1)
            self._check(node.right, depth + 1)
            return
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            self._check(node.operand, depth + 1)
            return
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in _FUNCTIONS and not node.keywords
                and not any(isinstance(arg, ast.Starred) for arg in node.args)):
            self._check_arity(node.func.id, len(node.args))
            for arg in node.args:
                self._check(arg, depth + 1)
            return
        raise self._error(f"{excerpt(ast.unparse(node))} is not allowed "
                          f"(numbers, names, + - * / // %, {', '.join(_FUNCTIONS)})")

    def _check_arity(self, function: str, count: int) -> None:
        fewest, most = _ARITY[function]
        if count < fewest or (most is not None and count > most):
            wanted = (f"{fewest} or more arguments" if most is None else f"{fewest} or {most} arguments"
                      if most > fewest else f"{fewest} argument")
            raise self._error(f"{function}() takes {wanted}, got {count}")

    def evaluate(self, values: Mapping[str, float]) -> float:
        missing = sorted(self.names - set(values))
        if missing:
            raise self._error(f"unknown name {missing[0]!r}")
        read = {name: values[name] for name in sorted(self.names)}  # for messages: not all of values
        try:
            result = self._eval(self._tree, values)
        except ZeroDivisionError:
            raise self._error(f"divides by zero for {read}") from None
        except (ArithmeticError, TypeError, ValueError) as err:  # int(inf), round(nan), a huge int
            raise self._error(f"cannot be computed for {read} ({err})") from None
        if isinstance(result, float) and not math.isfinite(result):
            raise self._error(f"is not finite ({result}) for {read}")
        return result

    def _eval(self, node: ast.AST, values: Mapping[str, float]) -> float:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return values[self._slots[node.id]]
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, values), self._eval(node.right, values)
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, values)
            return -value if isinstance(node.op, ast.USub) else value
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        return _FUNCTIONS[node.func.id](*(self._eval(arg, values) for arg in node.args))


def bound(value: float | str, key: str) -> float | Expr:
    """A bound from YAML: a number, or an expression string over earlier parameters."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key}={excerpt(value)}: expected a number or an expression string")
    if isinstance(value, str):
        expr = Expr(value, key)
        return expr.evaluate({}) if not expr.names else expr
    return value
