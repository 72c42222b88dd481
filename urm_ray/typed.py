"""Strict conversion of plain YAML data (dicts, lists, scalars) into typed dataclasses.

Used by every config: unknown keys, wrong types and values outside a ``Literal`` fail with a
``ConfigError`` naming the dotted key, the value and what was expected. Nothing is ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import types
from collections.abc import Iterable
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from urm_ray.errors import ConfigError

T = TypeVar("T")
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def from_dict(cls: type[T], data: Any, prefix: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, recursively and strictly."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping of keys, got {data!r}")
    hints, names = _fields(cls)
    unknown = sorted(set(data) - names)
    if unknown:
        where = f"{prefix}." if prefix else ""
        hint = did_you_mean(str(unknown[0]), names, where)
        raise ConfigError(
            f"unknown key {where}{unknown[0]!s}{hint}; valid keys here: {', '.join(sorted(names))}"
        )
    kwargs = {name: convert(hints[name], value, _join(prefix, name)) for name, value in data.items()}
    return cls(**kwargs)


def excerpt(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for an error message, cut after ``limit`` characters: a message stays one
    readable line whatever was given."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(str(value))} characters)"


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean train.steps?)`` for a mistyped ``word``: the closest of ``choices``
    (``prefix`` before it), or "" when none is close."""
    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


@functools.cache
def _fields(cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    """(resolved annotations, init field names) of a dataclass, once per class: resolving the
    string annotations is most of the cost of building a config (a space's grid check builds
    thousands)."""
    return get_type_hints(cls), frozenset(f.name for f in dataclasses.fields(cls) if f.init)


def to_dict(obj: Any) -> Any:
    """Inverse of ``from_dict``: dataclasses to dicts, tuples to lists (YAML-friendly)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def convert(tp: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert it (int→float, list→tuple)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{key}={value!r}: expected one of {list(get_args(tp))}")
        return value
    if origin in (Union, types.UnionType):
        return _convert_union(tp, value, key)
    if origin in (tuple, list):
        return _convert_sequence(tp, origin, value, key)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    return _convert_scalar(tp, value, key)


def _convert_union(tp: Any, value: Any, key: str) -> Any:
    args = get_args(tp)
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return convert(arg, value, key)
        except ConfigError as err:
            errors.append(str(err))
    raise ConfigError(errors[0] if len(errors) == 1 else f"{key}={value!r}: " + "; ".join(errors))


def _convert_sequence(tp: Any, origin: type, value: Any, key: str) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}={value!r}: expected a list")
    args = get_args(tp)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        items = [convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    elif origin is tuple and args:
        if len(args) != len(value):
            raise ConfigError(f"{key}={value!r}: expected a list of {len(args)} values")
        items = [convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value))]
    else:
        inner = args[0] if args else Any
        items = [convert(inner, v, f"{key}[{i}]") for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def _convert_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        return float(value)  # YAML 1.1 reads "3e-4" (no dot) as a string
    if tp is dict and isinstance(value, dict):
        return dict(value)
    if isinstance(tp, type) and isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    expected = getattr(tp, "__name__", str(tp))
    raise ConfigError(f"{key}={value!r}: expected {expected}, got {type(value).__name__}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
