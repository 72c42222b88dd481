"""The names a user gives runs, sweeps and MLflow experiments, checked once.

    check_name("train.run_name", "loops8")        -> "loops8"
    check_name("--name", "../x")                  -> ConfigError naming --name, the value and the rule

A name becomes a folder (``<checkpoint.storage_path>/<run_name>``, ``sweeps/<name>``), an Optuna study
name, an MLflow experiment name and a value inside MLflow's search filter (``tags.`...` = '<name>'``).
So it is one path component of letters, digits, ``.``, ``_`` and ``-`` only: no ``/`` (no folder
outside the intended one), no quote (no broken filter), no leading dot (no ``..``, no hidden
folder), and bounded in length.

``MAX_LENGTH`` (128) keeps a name well inside a file name's 255 bytes and MLflow's 250 characters
of a run name. A sweep's name is the stem of longer names it derives (``sweep-<name>``,
``<name>-final-t007-s2``, ``<name>-t123``), so it gets ``SWEEP_MAX_LENGTH`` (100): what it derives
stays under ``MAX_LENGTH`` too.
"""

from __future__ import annotations

import re
import time

from urm_ray.errors import ConfigError
from urm_ray.typed import excerpt

MAX_LENGTH = 128
SWEEP_MAX_LENGTH = 100  # room for the suffixes a sweep adds to its name (see the docstring)
_ALLOWED = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_DISALLOWED = re.compile(r"[^A-Za-z0-9._-]+")
RULE = "letters, digits, '.', '_' and '-', not starting with '.'"


def check_name(key: str, value: str, max_length: int = MAX_LENGTH) -> str:
    """``value`` if it is a valid name, else a ConfigError naming ``key``, the value and the rule."""
    if not isinstance(value, str) or not _ALLOWED.fullmatch(value):
        raise ConfigError(f"{key}={excerpt(value)}: a name may hold {RULE} (it becomes a folder and an "
                          "MLflow name)")
    if len(value) > max_length:
        raise ConfigError(f"{key}={excerpt(value)}: a name may be at most {max_length} characters, "
                          f"got {len(value)}")
    return value


def timestamped(stem: str, max_length: int = MAX_LENGTH) -> str:
    """A default name: ``stem`` (a space's file name, a model's name) made valid, then the time,
    e.g. ``my-space-20250101-120000``."""
    when = time.strftime("%Y%m%d-%H%M%S")
    stem = _DISALLOWED.sub("-", stem).lstrip(".-")[: max_length - len(when) - 1]
    return f"{stem}-{when}" if stem else when

