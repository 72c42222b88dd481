"""Search spaces: a YAML file naming a base training config, what to search and how.

    space = load_space("quickstart", ["trials=8", "train.steps=300"])  # or a YAML path
    values = space.suggest(optuna_trial)              # define-by-run, dependent bounds
    cfg = space.trial_config(values)                  # a validated RunConfig

SPACE is a YAML path, a name in ./search_spaces, or the name of a space shipped in
``urm_ray/search_spaces`` (package data, so an installed wheel has them too).

A space is checked completely before any trial starts: unknown parameter paths, empty ranges,
dependent bounds that can become impossible and values the training config rejects all raise
``ConfigError`` naming the parameter. Overrides whose first part is a config section
(``model``, ``data``, ``optim``, ``train``, ``tracking``) change the base config; the others
change the space (``trials=8``, ``scheduler.grace_steps=50``).
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional

import optuna
import yaml

from urm_ray.config import (
    RENAMED,
    SECTIONS,
    RunConfig,
    apply_overrides,
    build_config,
    flatten,
    parse_overrides,
    read_yaml,
    renamed,
    with_values,
)
from urm_ray.data.tasks import registry
from urm_ray.errors import CheckpointError, ConfigError
from urm_ray.eval.config import EvalConfig
from urm_ray.tune.expr import Expr
from urm_ray.tune.params import Param, Value
from urm_ray.typed import _fields, did_you_mean, from_dict, to_dict

CONFIG_SECTIONS = ("model", *SECTIONS)
# Set by the sweep itself (names, paths, resources) or fixed for fair comparison (length).
NOT_SEARCHABLE = ("train.steps", "train.run_name", "checkpoint.storage_path", "resources.num_workers",
                  "resources.cpus_per_worker", "resources.gpus_per_worker", "resources.device", "data.path")
MAX_COMBINATIONS = 4096  # combinations of grid values that validation tries, at most
# metrics a run reports: held-out evaluation (eval/*, and each task's own score, e.g. ARC's arc/*)
# and training
EVALUATED = registry.HELD_OUT_PREFIXES
TESTTIME = "eval/testtime/"  # what an evaluation sweep's trials report (``eval.testtime``)
REPORTED = (*EVALUATED, "train/")


@dataclass
class Objective:
    """A metric the sweep optimises, and in which direction."""

    metric: str = "eval/exact_accuracy"  # a reported metric (eval/*, arc/*, train/*) or a derived one
    mode: Literal["max", "min"] = "max"  # whether higher (max) or lower (min) is better


@dataclass
class Resources:
    """Per trial: Ray Train workers and their shares (GPU training when gpus_per_worker > 0)."""

    workers: int = 1  # Ray Train workers per trial (its resources.num_workers)
    cpus_per_worker: float = 1.0  # CPUs each worker reserves (its resources.cpus_per_worker)
    gpus_per_worker: float = 0.0  # GPUs each worker reserves; 0 = trials train on CPU
    # custom Ray resources per worker (resources.worker_resources), e.g. {"spot_gpu": 1} to keep
    # trials on the cluster's spot node types; concurrency is limited by what the cluster offers
    custom: dict = field(default_factory=dict)


@dataclass
class Scheduler:
    """Early stopping, in training steps; rungs should fall on evaluation steps."""

    name: Literal["asha", "median", "none"] = "asha"  # ASHA, the median-stopping rule, or no early stopping
    grace_steps: int = 0  # steps every trial runs before it can be stopped; 0 = eval.every
    reduction_factor: float = 3.0  # ASHA: 1 in this many trials goes on at each rung


@dataclass
class Search:
    """How Optuna proposes each trial's values."""

    sampler: Literal["tpe", "random"] = "tpe"  # Optuna's TPE sampler, or uniform random draws
    seed: int = 0  # the sampler's seed
    startup_trials: int = 8  # TPE: random trials before the model takes over
    # how a trial stopped early reaches Optuna: "pruned" (right), or "complete" with its early
    # value, as Ray's OptunaSearch does (the difference: docs/benchmarks.md, "Sweeps")
    pruned_as: Literal["pruned", "complete"] = "pruned"


@dataclass
class Final:
    """Defaults of ``urm-ray final``: top configs re-run over seeds, then the long run."""

    top: int = 3  # best trials re-run
    seeds: int = 3  # seeds each of them is re-run with
    overrides: dict = field(default_factory=dict)  # dotted keys for the final training run


@dataclass
class SpaceSpec:
    """The YAML schema of a search space."""

    # the searched parameters, by dotted config key, sampled in this order (a bound may read the
    # parameters before it)
    params: dict
    base: str = ""  # preset name or YAML path (relative to the space file)
    # an evaluation sweep instead: the checkpoint folder whose test-time settings (eval.*) the
    # trials search; each trial evaluates it and trains nothing (its config is the default base)
    checkpoint: str = ""
    description: str = ""  # what the space searches, in one line
    overrides: dict = field(default_factory=dict)  # fixed dotted-key changes to the base
    # the metrics optimised; several make a Pareto front (early stopping then stops a trial only
    # where another dominates it). One objective may instead be given as top-level metric/mode.
    objectives: list[Objective] = field(default_factory=lambda: [Objective()])
    derived: dict = field(default_factory=dict)  # metric name -> expression over metrics and params
    start_from: list = field(default_factory=list)  # parameter dicts tried first (e.g. the paper's)
    trials: int = 16  # trials the sweep runs in all
    concurrency: int = 0  # trials at once; 0 = as many as the resources allow
    # times a failed trial (e.g. its node was preempted) restarts from its last checkpoint;
    # null = 2 when trials train on GPUs (spot nodes get reclaimed), else 0
    retries: Optional[int] = None
    resources: Resources = field(default_factory=Resources)
    scheduler: Scheduler = field(default_factory=Scheduler)
    search: Search = field(default_factory=Search)
    final: Final = field(default_factory=Final)


@dataclass
class SearchSpace:
    """A validated space: the spec, the base config (dict and typed) and the compiled params."""

    name: str
    spec: SpaceSpec
    base: dict[str, Any]  # base config after the fixed overrides, as a nested dict
    params: list[Param]
    derived: dict[str, Expr]
    base_config: RunConfig = field(init=False)
    fixed: dict[str, float] = field(init=False)  # numeric config values bounds may read

    def __post_init__(self) -> None:
        self.base_config = build_config(self.base)
        self.fixed = _numeric(flatten(self.base_config))

    @property
    def metric(self) -> str:
        return self.spec.objectives[0].metric

    @property
    def mode(self) -> str:
        return self.spec.objectives[0].mode

    @property
    def retries(self) -> int:
        """Restarts of a failed trial from its last checkpoint."""
        if self.spec.retries is not None:
            return self.spec.retries
        return 2 if self.spec.resources.gpus_per_worker > 0 else 0

    @property
    def evaluates(self) -> bool:
        """An evaluation sweep: trials evaluate ``spec.checkpoint``, they do not train."""
        return bool(self.spec.checkpoint)

    @property
    def steps(self) -> int:
        """Results a trial reports to the end: training steps, or the one of an evaluation."""
        return 1 if self.evaluates else self.base_config.train.steps

    def env(self, values: dict[str, Value]) -> dict[str, float]:
        """What bounds and derived metrics may read: fixed config values, then sampled ones."""
        return {**self.fixed, **_numeric(values)}

    def suggest(self, trial: optuna.Trial) -> dict[str, Value]:
        values: dict[str, Value] = {}
        for param in self.params:
            values[param.key] = param.suggest(trial, self.env(values))
        return values

    def trial_config(self, values: dict[str, Value], extra: dict[str, Any] | None = None) -> RunConfig:
        """The base config with sampled ``values`` and sweep-set ``extra`` keys (dotted)."""
        return build_config(with_values(self.base, {**values, **(extra or {})}))

    def to_yaml(self) -> str:
        return yaml.safe_dump(to_dict(self.spec), sort_keys=False)


def shipped_spaces() -> dict[str, Path]:
    """Name -> file of the spaces shipped in ``urm_ray/search_spaces`` (their bases sit in base/)."""
    # a real folder, not a Traversable: a space's base is read relative to the space's file
    folder = Path(str(resources.files("urm_ray") / "search_spaces"))
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def find_space(source: str) -> Path:
    """A YAML path, or a space name looked up in ./search_spaces, then in the shipped spaces."""
    shipped = shipped_spaces()
    for path in (Path(source), Path("search_spaces") / f"{source}.yaml", shipped.get(source)):
        if path is not None and path.is_file():
            return path
    raise ConfigError(f"search space {source!r} not found{did_you_mean(source, shipped)}; "
                      f"shipped spaces: {', '.join(shipped)}")


def load_space(source: str, overrides: list[str] | None = None) -> SearchSpace:
    path = find_space(source)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping, got {type(data).__name__}")
    return space_from_dict(data, path, overrides or [])


def _space_key(key: str) -> bool:
    """Whether a dotted override key names a key of the space file: ``checkpoint`` and
    ``resources.workers`` do, ``checkpoint.every`` and ``resources.num_workers`` (run config
    sections of the same names) do not."""
    head, _, rest = key.partition(".")
    hints, names = _fields(SpaceSpec)
    if head not in names:
        return False
    if not rest or not dataclasses.is_dataclass(hints[head]):
        return not rest or head not in CONFIG_SECTIONS
    return rest.split(".")[0] in _fields(hints[head])[1]


def space_from_dict(data: dict[str, Any], path: Path, overrides: list[str]) -> SearchSpace:
    config_over = [o for o in overrides if o.partition("=")[0].split(".")[0] in CONFIG_SECTIONS
                   and not _space_key(o.partition("=")[0])]
    space_over = [o for o in overrides if o not in config_over]
    data = _one_objective_form(with_values(data, parse_overrides(space_over, "trials=8")), path)
    spec = from_dict(SpaceSpec, data, path.stem)
    if not spec.base and not spec.checkpoint:
        raise ConfigError(f"search space {path.name}: give base (a training sweep) or checkpoint (an evaluation "
                          "sweep)")
    if spec.checkpoint:
        spec.checkpoint = str(Path(spec.checkpoint).resolve())
    if not spec.base:  # an evaluation sweep's base: the checkpoint's own config
        base_dict = _checkpoint_config(Path(spec.checkpoint))
    else:
        base_path = path.parent / spec.base
        base_dict = read_yaml(str(base_path) if base_path.is_file() else spec.base)
    base_dict = with_values(base_dict, spec.overrides)
    base_dict = apply_overrides(base_dict, config_over)
    try:
        build_config(base_dict)
    except ConfigError as err:
        raise ConfigError(f"search space {path.name}: base config {spec.base!r}: {err}") from err
    try:
        params = [Param.parse(str(key), value) for key, value in spec.params.items()]
        derived = {str(k): Expr(str(v), f"derived.{k}") for k, v in spec.derived.items()}
        space = SearchSpace(path.stem, spec, base_dict, params, derived)
        validate(space)
    except ConfigError as err:
        raise ConfigError(f"search space {path.name}: {err}") from err
    if spec.checkpoint:  # last: it reads the whole state
        _check_checkpoint_state(path, Path(spec.checkpoint))
    return space


def _one_objective_form(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``metric: M, mode: max`` is ``objectives: [{metric: M, mode: max}]``; both forms together
    are ambiguous."""
    short = [k for k in ("metric", "mode") if k in data]
    if not short:
        return data
    if "objectives" in data:
        raise ConfigError(f"search space {path.name}: give either {' and '.join(short)} (one objective) "
                          "or objectives (a list of {metric, mode}), not both")
    if "metric" not in data:
        raise ConfigError(f"search space {path.name}: mode without metric; give metric too, or objectives")
    rest = {k: v for k, v in data.items() if k not in short}
    return {**rest, "objectives": [{"metric": data["metric"], "mode": data.get("mode", "max")}]}


def _checkpoint_config(folder: Path) -> dict[str, Any]:
    """The run config a checkpoint folder holds (its config.yaml), for an evaluation sweep."""
    path = folder / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"checkpoint {folder}: not a urm_ray checkpoint folder (config.yaml is missing); "
                          "expected a checkpoint_<time> folder under checkpoint.storage_path/<run_name>")
    data = yaml.safe_load(path.read_text())
    return renamed(data) if isinstance(data, dict) else data  # written before a rename: new key names


def _check_checkpoint_state(path: Path, folder: Path) -> None:
    """An evaluation sweep's checkpoint loads as data (a crafted or damaged ``state.pt`` is
    refused here, before any trial)."""
    from urm_ray.train import checkpoint  # imports torch: only for an evaluation sweep

    try:
        checkpoint.load_state(folder)
    except CheckpointError as err:
        raise type(err)(f"search space {path.name}: checkpoint: {err}") from None


def validate(space: SearchSpace) -> None:
    """Everything a trial could hit, checked now; each error names its parameter."""
    spec, known = space.spec, flatten(space.base_config)
    if not space.params:
        raise ConfigError("params: nothing to search")
    _check_numbers(spec)
    seen: set[str] = set()
    for param in space.params:
        if param.key in RENAMED:
            raise ConfigError(f"parameter {param.key}: {param.key} was renamed {RENAMED[param.key]}")
        if param.key not in known:
            raise ConfigError(f"parameter {param.key}: unknown config key{did_you_mean(param.key, known)} "
                              f"(valid: {_close(param.key, known)})")
        if param.key in NOT_SEARCHABLE or param.key.startswith("tracking."):
            raise ConfigError(f"parameter {param.key}: set by the sweep, cannot be searched")
        for name in sorted(param.depends_on):
            if name in spec.params and name not in seen:
                raise ConfigError(f"parameter {param.key}: bound reads {name}, which is declared "
                                  "later (params are sampled in order)")
            if name not in seen and name not in space.fixed:
                raise ConfigError(f"parameter {param.key}: bound reads unknown {name!r}")
        seen.add(param.key)
    if space.evaluates:
        _check_evaluation(space)
    if not space.base_config.tracking.enabled:
        raise ConfigError("tracking.enabled=false: a sweep records every trial (and its fate, for "
                          "resume) in MLflow")
    _check_objectives(space)
    _check_scheduler(space)
    _check_grid(space)
    for point in spec.start_from:
        _check_point(space, point)


def _check_numbers(spec: SpaceSpec) -> None:
    checks = [("trials", spec.trials >= 1), ("concurrency", spec.concurrency >= 0),
              ("retries", spec.retries is None or spec.retries >= 0),
              ("resources.workers", spec.resources.workers >= 1),
              ("resources.cpus_per_worker", spec.resources.cpus_per_worker > 0),
              ("resources.gpus_per_worker", spec.resources.gpus_per_worker >= 0),
              ("search.startup_trials", spec.search.startup_trials >= 0),
              ("final.top", spec.final.top >= 1), ("final.seeds", spec.final.seeds >= 1)]
    for key, ok in checks:
        if not ok:
            raise ConfigError(f"{key}={_get(spec, key)} is out of range")


def _check_objectives(space: SearchSpace) -> None:
    if not space.spec.objectives:
        raise ConfigError("objectives: at least one metric is needed")
    for objective in space.spec.objectives:
        name = objective.metric
        if not (name.startswith(REPORTED) or name in space.derived):
            raise ConfigError(f"objectives: metric {name!r} is neither reported (eval/*, arc/*, "
                              "train/*) nor derived")
        scored_by = registry.scored_by(name)
        if scored_by is not None and not space.base_config.eval.views:
            raise ConfigError(f"objectives: {name} is reported only with eval.views=true (the "
                              f"{scored_by.name} task's own score, voted over eval.width views)")
    metrics = [o.metric for o in space.spec.objectives]
    repeated = sorted({m for m in metrics if metrics.count(m) > 1})
    if repeated:
        raise ConfigError(f"objectives: metric {repeated[0]!r} appears more than once")
    if len(metrics) > 1 and space.spec.search.pruned_as == "complete":
        raise ConfigError("search.pruned_as=complete with several objectives would put a trial's early "
                          "values on the Pareto front; use pruned_as=pruned")
    params = {p.key for p in space.params} | set(space.fixed)
    for name, expr in space.derived.items():
        unknown = sorted(n for n in expr.names if n not in params and not n.startswith(REPORTED))
        if unknown:
            raise ConfigError(f"derived {name}: unknown name {unknown[0]!r}")


def _check_evaluation(space: SearchSpace) -> None:
    """An evaluation sweep searches the eval section, optimises test-time metrics, prunes nothing."""
    for param in space.params:
        if not param.key.startswith("eval."):
            raise ConfigError(f"parameter {param.key}: an evaluation sweep (checkpoint: ...) searches the "
                              "test-time settings eval.* only; its model is trained")
    for objective in space.spec.objectives:
        if not objective.metric.startswith(TESTTIME) and objective.metric not in space.derived:
            raise ConfigError(f"objective {objective.metric}: an evaluation sweep reports {TESTTIME}* "
                              "(exact_accuracy, passes_per_puzzle, seconds_per_puzzle, ...)")
    if space.spec.scheduler.name != "none":
        raise ConfigError(f"scheduler.name={space.spec.scheduler.name}: an evaluation trial reports once, "
                          "there is nothing to stop early; use scheduler.name=none")
    searched = {p.key for p in space.params}
    if space.base_config.eval.views or space.fixed.get("eval.views") or "eval.views" in searched:
        from urm_ray.evaluate import task_of

        EvalConfig(views=True).check_task(task_of(space.spec.checkpoint))


def _check_scheduler(space: SearchSpace) -> None:
    sched, train, every = space.spec.scheduler, space.base_config.train, space.base_config.eval.every
    if sched.name == "none":
        return
    if space.metric.startswith(EVALUATED) and every == 0:
        raise ConfigError(f"scheduler.name={sched.name} prunes on {space.metric}, which is only "
                          "reported at the end with eval.every=0; set eval.every")
    grace = sched.grace_steps or every or train.log_every
    if not 0 < grace < train.steps:
        raise ConfigError(f"scheduler.grace_steps={grace} must be in (0, train.steps={train.steps})")
    if every and grace % every:
        raise ConfigError(f"scheduler.grace_steps={grace} must be a multiple of eval.every="
                          f"{every}, so pruning compares fresh evaluations")
    if len(space.spec.objectives) > 1 and sched.name == "median":
        raise ConfigError("scheduler.name=median compares the first objective alone; with several "
                          "objectives use asha (it stops a trial only where another dominates it) or none")
    if sched.name == "asha" and sched.reduction_factor <= 1:
        raise ConfigError(f"scheduler.reduction_factor={sched.reduction_factor} must be > 1")


def _check_grid(space: SearchSpace) -> None:
    """Build the config at every combination of the parameters' grid values (every integer and
    choice, a float range's ends and middle; dependent bounds evaluated at each), up to
    MAX_COMBINATIONS of them, so an impossible combination is named before any trial starts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "has no effect" warnings are not errors here
        for values in itertools.islice(_grid(space, 0, {}), MAX_COMBINATIONS):
            try:
                space.trial_config(values)
            except ConfigError as err:
                raise ConfigError(f"impossible combination {values}: {err}") from err


def _grid(space: SearchSpace, index: int, values: dict[str, Value]) -> Iterator[dict[str, Value]]:
    if index == len(space.params):
        yield dict(values)
        return
    param = space.params[index]
    for value in param.grid(space.env(values)):
        values[param.key] = value
        yield from _grid(space, index + 1, values)
    values.pop(param.key, None)


def check_point(space: SearchSpace, point: Any) -> None:
    """A point to try first (``start_from``, ``--warm-start``) sets exactly the searched keys,
    each inside its range; else a ConfigError naming the key."""
    _check_point(space, point)


def _check_point(space: SearchSpace, point: Any) -> None:
    keys = [p.key for p in space.params]
    if not isinstance(point, dict) or set(point) != set(keys):
        raise ConfigError(f"start_from: {point!r} must set exactly the searched keys {keys}")
    for param in space.params:
        value = point[param.key]
        if param.kind == "categorical":
            ok = value in param.choices
        else:
            low, high = param.bounds(space.env(point))
            ok = isinstance(value, (int, float)) and low <= value <= high
        if not ok:
            raise ConfigError(f"start_from: {param.key}={value!r} is outside the searched range")
    space.trial_config(point)


def _numeric(values: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _close(key: str, known: dict[str, Any]) -> str:
    section = key.split(".")[0]
    same = sorted(k for k in known if k.split(".")[0] == section)
    return ", ".join(same) if same else ", ".join(CONFIG_SECTIONS)


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj
