"""Small arithmetic expressions for search-space bounds and derived metrics.

    Expr("model.loops - 1").evaluate({"model.loops": 6})                       -> 5
    Expr("eval/mean_segments * model.loops").evaluate({...})                   -> compute per row

Names are dotted config keys or metric names (``eval/mean_segments``); write division with
spaces around ``/`` so it is not read as part of a name. Allowed: numbers, names, ``+ - * / //
%``, unary minus, ``min``, ``max``, ``round``, ``int``. Nothing else is evaluated (no attribute
access, no calls of other functions), so a YAML file cannot run code.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Mapping

from urm_ray.errors import ConfigError

# a dotted name, optionally with /-separated parts (metric names such as eval/exact_accuracy)
_NAME = re.compile(r"(?<![\w.])[A-Za-z_][\w.]*(?:/[A-Za-z_][\w.]*)*")
_FUNCTIONS: dict[str, Callable[..., float]] = {"min": min, "max": max, "round": round, "int": int}
_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}


class Expr:
    """A parsed expression; ``names`` are the variables it reads."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._slots: dict[str, str] = {}  # placeholder identifier -> original name
        source = _NAME.sub(self._placeholder, text)
        try:
            self._tree = ast.parse(source, mode="eval").body
        except SyntaxError as err:
            raise ConfigError(f"expression {text!r}: not valid arithmetic ({err.msg})") from err
        self._check(self._tree)
        self.names = frozenset(self._slots.values())

    def _placeholder(self, match: re.Match[str]) -> str:
        name = match.group(0)
        if name in _FUNCTIONS:
            return name
        slot = f"_v{len(self._slots)}"
        self._slots[slot] = name
        return slot

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return
        if isinstance(node, ast.Name) and node.id in self._slots:
            return
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            self._check(node.left)
            self._check(node.right)
            return
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            self._check(node.operand)
            return
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in _FUNCTIONS and not node.keywords):
            for arg in node.args:
                self._check(arg)
            return
        raise ConfigError(
            f"expression {self.text!r}: {ast.unparse(node)!r} is not allowed "
            f"(numbers, names, + - * / // %, {', '.join(_FUNCTIONS)})"
        )

    def evaluate(self, values: Mapping[str, float]) -> float:
        missing = sorted(self.names - set(values))
        if missing:
            raise ConfigError(f"expression {self.text!r}: unknown name {missing[0]!r}")
        result = self._eval(self._tree, values)
        if isinstance(result, float) and not math.isfinite(result):
            raise ConfigError(f"expression {self.text!r} is not finite for {dict(values)}")
        return result

    def _eval(self, node: ast.AST, values: Mapping[str, float]) -> float:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return values[self._slots[node.id]]
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, values), self._eval(node.right, values)
            try:
                return _BINARY[type(node.op)](left, right)
            except ZeroDivisionError as err:
                raise ConfigError(f"expression {self.text!r} divides by zero for {dict(values)}") from err
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, values)
            return -value if isinstance(node.op, ast.USub) else value
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        return _FUNCTIONS[node.func.id](*(self._eval(arg, values) for arg in node.args))


def bound(value: float | str, key: str) -> float | Expr:
    """A bound from YAML: a number, or an expression string over earlier parameters."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key}={value!r}: expected a number or an expression string")
    if isinstance(value, str):
        expr = Expr(value)
        return expr.evaluate({}) if not expr.names else expr
    return value
