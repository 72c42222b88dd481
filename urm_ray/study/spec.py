"""A study file (``studies/NAME.yaml``): the rows compared and the protocol every row follows.

    study = load_study("studies/sudoku4-families.yaml")   # StudyError before any work
    study.rows[0].space                                   # the row's validated SearchSpace

Every row is one sweep (its search space, model family, task and budget of trials) followed by
the same protocol: the top configs re-checked over seeds, the winner trained over seeds, its
metrics reported as mean +- sd with a Student-t interval. Everything is checked here, before Ray
starts: unknown keys, a space that does not load, a family the space does not train, a metric
no run reports, a benchmark with no published figures, numbers out of range.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from urm_ray.errors import ConfigError
from urm_ray.names import SWEEP_MAX_LENGTH, check_name
from urm_ray.study.baselines import BENCHMARKS
from urm_ray.tune.space import REPORTED, SearchSpace, find_space, load_space
from urm_ray.typed import did_you_mean, from_dict

# a row's sweep is named <study>-<row>, and a sweep adds its own suffixes
NAME_LENGTH = SWEEP_MAX_LENGTH // 2


class StudyError(ConfigError):
    """The study file is malformed or inconsistent; the message names the file and the key."""


@dataclass
class Protocol:
    """What every row does after its sweep, and what the table reports."""

    trials: int = 8  # trials per sweep (a row's own ``trials`` overrides it)
    top: int = 2  # best trials of each sweep re-checked over seeds at the sweep's trial length
    recheck_seeds: int = 2  # seeds of each re-check run; top 1 with one seed re-checks nothing
    seeds: int = 3  # seeds the winner trains with at full length: the table's n
    # the metrics the table reports (each one's mean, sd and interval over the final seeds)
    metrics: list = field(default_factory=lambda: ["eval/exact_accuracy"])
    # dotted keys of the final training runs (default: the space's final overrides), and the
    # evaluation settings of their held-out evaluation (eval.*: test-time width, depth, noise)
    final: dict = field(default_factory=dict)
    eval: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)  # dotted keys every row's sweep gets


@dataclass
class RowSpec:
    """One line of the table: a model family swept on a task."""

    name: str
    space: str  # search-space YAML (relative to the study file) or a shipped space's name
    family: str  # the model family the space trains (its base config's model.name)
    task: str = ""  # the task or dataset, as the table names it (default: the base's data.path)
    benchmark: str = ""  # the published figures it is compared with (see baselines.BENCHMARKS)
    trials: int = 0  # the sweep's budget; 0 = the protocol's
    overrides: dict = field(default_factory=dict)  # dotted keys of this row's sweep


@dataclass
class StudySpec:
    """The YAML schema of a study."""

    name: str
    rows: list[RowSpec]
    protocol: Protocol = field(default_factory=Protocol)
    description: str = ""


@dataclass
class Row:
    """A validated row: its spec, the space it resolved to and its sweep's overrides."""

    spec: RowSpec
    space: SearchSpace
    space_file: str  # absolute path
    sweep_overrides: list[str]

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def trials(self) -> int:
        return self.space.spec.trials


@dataclass
class Study:
    spec: StudySpec
    path: Path
    rows: list[Row]

    @property
    def name(self) -> str:
        return self.spec.name

    def sweep_name(self, row: Row) -> str:
        return f"{self.name}-{row.name}"


def load_study(source: str) -> Study:
    """The study file, parsed and every row's space loaded with its overrides."""
    path = Path(source)
    if not path.is_file():
        raise StudyError(f"study file {source}: not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise StudyError(f"{path}: not valid YAML: {err}") from None
    try:
        spec = from_dict(StudySpec, data, "")
        _check_spec(spec)
        rows = [_load_row(spec, row, i, path) for i, row in enumerate(spec.rows)]
    except StudyError as err:
        raise StudyError(f"{path}: {err}") from None
    except ConfigError as err:
        raise StudyError(f"{path}: {err}") from None
    return Study(spec, path.resolve(), rows)


def _check_spec(spec: StudySpec) -> None:
    check_name("name", spec.name, NAME_LENGTH)
    if not spec.rows:
        raise StudyError("rows: expected at least one row")
    names = [row.name for row in spec.rows]
    for i, name in enumerate(names):
        check_name(f"rows[{i}].name", name, NAME_LENGTH)
        if name in names[:i]:
            raise StudyError(f"rows[{i}].name={name!r}: another row has that name; row names must differ")
    p = spec.protocol
    for key in ("trials", "top", "recheck_seeds", "seeds"):
        if getattr(p, key) < 1:
            raise StudyError(f"protocol.{key}={getattr(p, key)}: expected an integer of at least 1")
    if p.seeds < 2:
        raise StudyError(f"protocol.seeds={p.seeds}: a standard deviation needs at least 2 seeds")
    if not p.metrics:
        raise StudyError("protocol.metrics: expected at least one metric")
    for metric in p.metrics:
        if not isinstance(metric, str) or not metric.startswith(REPORTED):
            raise StudyError(f"protocol.metrics: {metric!r} is no metric a run reports; expected a name "
                             f"starting with one of {', '.join(REPORTED)}")
    for key in p.eval:
        if "." in str(key):
            raise StudyError(f"protocol.eval.{key}: give the eval section's own keys (width: 8), not dotted ones")
    for i, row in enumerate(spec.rows):
        if row.benchmark and row.benchmark not in BENCHMARKS:
            raise StudyError(f"rows[{i}].benchmark={row.benchmark!r}: expected one of "
                             f"{', '.join(BENCHMARKS)}{did_you_mean(row.benchmark, BENCHMARKS)} (or none)")
        if row.trials < 0:
            raise StudyError(f"rows[{i}].trials={row.trials}: expected 0 (the protocol's) or more")


def _load_row(spec: StudySpec, row: RowSpec, index: int, path: Path) -> Row:
    where = f"rows[{index}] ({row.name})"
    relative = path.parent / row.space
    source = str(relative) if relative.is_file() else row.space
    try:
        space_file = str(find_space(source).resolve())
    except ConfigError as err:
        raise StudyError(f"{where}.space: {err}") from None
    trials = row.trials or spec.protocol.trials
    overrides = [_override(k, v) for k, v in {**spec.protocol.overrides, **row.overrides,
                                              "trials": trials}.items()]
    try:
        space = load_space(space_file, overrides)
    except ConfigError as err:
        raise StudyError(f"{where}: {err}") from None
    if space.evaluates:
        raise StudyError(f"{where}.space: {row.space} is an evaluation sweep; a study row trains")
    family = space.base_config.model.name
    if row.family != family:
        raise StudyError(f"{where}.family={row.family!r}: its space {row.space} trains {family!r}")
    if spec.protocol.top > space.spec.trials:
        raise StudyError(f"protocol.top={spec.protocol.top}: more than {where}'s {space.spec.trials} trials")
    if len(space.spec.objectives) > 1:
        raise StudyError(f"{where}.space: {row.space} has several objectives; a study row ranks by one")
    _check_final(spec.protocol, space, where)
    return Row(row, space, space_file, overrides)


def _check_final(protocol: Protocol, space: SearchSpace, where: str) -> None:
    """The final runs' config builds (the final and eval keys are valid for this family)."""
    try:
        space.trial_config({}, final_overrides(protocol, space))
    except ConfigError as err:
        raise StudyError(f"{where}: protocol.final / protocol.eval: {err}") from None


def final_overrides(protocol: Protocol, space: SearchSpace) -> dict[str, Any]:
    """Dotted keys of a row's final runs: the space's final overrides, the protocol's, its eval."""
    evaluation = {f"eval.{k}": v for k, v in protocol.eval.items()}
    return {**space.spec.final.overrides, **protocol.final, **evaluation}


def _override(key: str, value: Any) -> str:
    """``key=value`` as the sweep command takes it (the value parsed back as YAML)."""
    if isinstance(value, (dict, list)):
        raise StudyError(f"overrides.{key}: expected a single value, got {value!r}")
    return f"{key}={json.dumps(value)}"
