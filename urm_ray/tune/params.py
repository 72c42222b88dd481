"""One searched parameter: its distribution, bounds (numbers or expressions) and Optuna call.

    Param.parse("model.truncation", {"type": "int", "low": 0, "high": "model.loops - 1"})

Bounds may read earlier parameters and fixed config values (``env``), which is how dependent
bounds are written: the truncation index below the loop count, loops against the ACT limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Optional

import optuna

from urm_ray.errors import ConfigError
from urm_ray.tune.expr import Expr, bound
from urm_ray.typed import from_dict

Kind = Literal["int", "log_int", "float", "log_float", "categorical"]
Value = Any  # int, float, str or bool


MAX_GRID = 33  # integer values per parameter that validation tries


@dataclass
class ParamSpec:
    """A parameter as written in a search-space YAML file."""

    # how the value is drawn: int / float uniformly, log_int / log_float log-uniformly, or one of
    # the choices
    type: Kind
    # lower bound (numeric types): a number, or an expression over earlier parameters and config
    # values, e.g. "model.loops - 1"
    low: Any = None
    high: Any = None  # upper bound, inclusive (numeric types): a number or an expression, as low
    step: Optional[float] = None  # grid step (int, float); null for log types
    choices: Optional[list] = None  # the values to choose from (categorical only)


@dataclass(frozen=True)
class Param:
    key: str  # dotted config key, e.g. model.loops
    kind: Kind
    low: float | Expr | None
    high: float | Expr | None
    step: float | None
    choices: tuple[Value, ...]

    @staticmethod
    def parse(key: str, data: Any) -> Param:
        spec = from_dict(ParamSpec, data, f"params.{key}")
        if spec.type == "categorical":
            if not spec.choices:
                raise ConfigError(f"parameter {key}: categorical needs a non-empty 'choices' list")
            if spec.low is not None or spec.high is not None or spec.step is not None:
                raise ConfigError(f"parameter {key}: categorical takes 'choices', not low/high/step")
            return Param(key, spec.type, None, None, None, tuple(spec.choices))
        if spec.low is None or spec.high is None or spec.choices is not None:
            raise ConfigError(f"parameter {key}: type {spec.type} needs 'low' and 'high' (no choices)")
        if spec.step is not None and (spec.type.startswith("log") or spec.step <= 0):
            raise ConfigError(f"parameter {key}: step={spec.step} needs a linear type and step > 0")
        low, high = bound(spec.low, f"{key}.low"), bound(spec.high, f"{key}.high")
        return Param(key, spec.type, low, high, spec.step, ())

    @property
    def depends_on(self) -> frozenset[str]:
        return frozenset().union(*(b.names for b in (self.low, self.high) if isinstance(b, Expr)))

    def bounds(self, env: Mapping[str, float]) -> tuple[float, float]:
        """(low, high) given the values of earlier parameters and fixed config keys."""
        assert self.kind != "categorical"
        low, high = (self._resolve(b, env, side) for b, side in ((self.low, "low"), (self.high, "high")))
        where = _where(self.depends_on, env)
        if low > high:
            raise ConfigError(f"parameter {self.key}: empty range [{low}, {high}]{where}")
        if self.kind.startswith("log") and low <= 0:
            raise ConfigError(f"parameter {self.key}: log range needs low > 0, got {low}{where}")
        return low, high

    def _resolve(self, value: float | Expr | None, env: Mapping[str, float], side: str) -> float:
        assert value is not None
        number = value.evaluate(env) if isinstance(value, Expr) else value
        if self.kind.endswith("int"):
            if number != math.floor(number):
                raise ConfigError(f"parameter {self.key}: {side}={number} is not an integer"
                                  f"{_where(self.depends_on, env)} (use // in expressions)")
            return int(number)
        return float(number)

    def grid(self, env: Mapping[str, float]) -> list[Value]:
        """The values a validation pass tries: every choice; every value of an integer range (at
        most MAX_GRID of them, evenly spread, the ends included); a float range's ends and middle
        (geometric for log ranges)."""
        if self.kind == "categorical":
            return list(self.choices)
        low, high = self.bounds(env)
        if self.kind.endswith("int"):
            values = list(range(int(low), int(high) + 1, int(self.step or 1)))
            if len(values) > MAX_GRID:
                picks = sorted({round(i * (len(values) - 1) / (MAX_GRID - 1)) for i in range(MAX_GRID)})
                values = [values[i] for i in picks]
            return values
        if low == high:
            return [low]
        middle = math.sqrt(low * high) if self.kind.startswith("log") else (low + high) / 2
        return [low, middle, high]

    def suggest(self, trial: optuna.Trial, env: Mapping[str, float]) -> Value:
        """Ask Optuna for this parameter (define-by-run: bounds computed from ``env``)."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.key, list(self.choices))
        low, high = self.bounds(env)
        log = self.kind.startswith("log")
        if self.kind.endswith("int"):
            return trial.suggest_int(self.key, int(low), int(high), step=int(self.step or 1), log=log)
        return trial.suggest_float(self.key, low, high, step=self.step, log=log)


def _where(names: frozenset[str], env: Mapping[str, float]) -> str:
    if not names:
        return ""
    return " when " + ", ".join(f"{n}={env[n]}" for n in sorted(names) if n in env)
