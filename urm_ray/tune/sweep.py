"""Run a sweep: Ray Tune over the Train driver, OptunaSearch (TPE) + ASHA, MLflow parent run.

    info, space = create_sweep("quickstart", ["trials=8"])
    outcome = run_sweep(info, space)
    info, space = load_sweep(outcome.name); run_sweep(info, space, resume=True)   # after Ctrl-C

A sweep lives in ``<root>/<name>/``: ``sweep.json`` (where its study and runs are),
``space.yaml`` + ``base_config.yaml`` (the space as resolved at creation, so a resume samples
exactly the same space), ``optuna.db`` (the study, unless ``storage`` names another database),
``tune/`` (Tune's experiment state and the one-worker trials' checkpoints), ``trials/`` (each
Ray Train run of a trial of several workers) and, when it ends, ``best_config.yaml``,
``leaderboard.csv`` and ``plots/``. When ``checkpoint.storage_path`` is an ``s3://`` URL, ``tune/`` and
``trials/`` are there instead, under ``<storage_path>/<name>/``, which every node of a cluster
reaches; on a cluster of several nodes a local one is refused (``check_nodes``).

Resume: Tune's saved state brings back its trials and the searcher; unfinished trials restart
their Train run from its last checkpoint; Optuna trials the state does not know (asked after
its last save) are taken over by the next suggestions (see ``search.py``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import optuna
import ray
import yaml
from ray import tune
from ray.exceptions import RayError
from ray.tune.schedulers import FIFOScheduler, MedianStoppingRule, TrialScheduler

from urm_ray import heartbeat, redact, tracking
from urm_ray.cluster import check_reachable, init_ray, scaled_up
from urm_ray.config import resolve_tracking_uri
from urm_ray.data import builtin, stream
from urm_ray.data.store import DatasetMeta
from urm_ray.errors import ConfigError
from urm_ray.names import SWEEP_MAX_LENGTH, check_name, timestamped
from urm_ray.tracking import KIND_TAG, SWEEP_TAG
from urm_ray.tune import cost, databases, report
from urm_ray.tune.fate import FateRecorder, record_interrupted
from urm_ray.tune.info import INFO_FILE, SweepInfo, storage
from urm_ray.tune.resources import Plan, plan, trial_bundles
from urm_ray.tune.rungs import StudyASHA, StudyDominance
from urm_ray.tune.search import TRIAL_KEY, make_sampler
from urm_ray.tune.space import SearchSpace, check_point, find_space, load_space
from urm_ray.tune.table import TrialTable
from urm_ray.tune.trial import TrialContext, run_trial
from urm_ray.typed import to_dict

DEFAULT_ROOT = "sweeps"
WARM_START_TOP = 3  # trials --warm-start OTHER takes without :k
MAX_IDLE_RESTARTS = 2  # restarts in a row after a fault of the cluster that finished no trial


@dataclass
class SweepOutcome:
    name: str
    finished: int  # trials completed, pruned or failed
    requested: int
    best_value: Any
    best_config_path: str | None
    capped: str = ""  # the cap that stopped new trials, if one did

    @property
    def interrupted(self) -> bool:
        return self.finished < self.requested and not self.capped


def create_sweep(source: str, overrides: list[str], name: str = "", root: str = DEFAULT_ROOT,
                 storage_url: str = "", warm_start: str = "") -> tuple[SweepInfo, SearchSpace]:
    """Validate the name and the space, then lay out a new sweep folder (nothing runs yet).

    ``warm_start``: ``OTHER[:k]``, the best k (default 3) completed trials of the sweep OTHER in
    ``root``, tried first (after the space's own ``start_from``)."""
    if name:
        check_name("--name", name, SWEEP_MAX_LENGTH)
    space = load_space(source, overrides)
    warm = warm_points(warm_start, root, space) if warm_start else []
    name = name or timestamped(space.name, SWEEP_MAX_LENGTH)
    folder = Path(root).resolve() / name
    if (folder / INFO_FILE).exists():
        raise ConfigError(f"sweep {name!r} already exists in {folder.parent}; resume it with "
                          f"`urm-ray sweep --resume {name}` or choose another --name")
    uri = resolve_tracking_uri(space.base_config.tracking.tracking_uri)
    optuna_url = storage_url or f"sqlite:///{folder / 'optuna.db'}"
    redact.remember(optuna_url)  # Tune saves the searcher without it and may read it back here
    _check_databases(optuna_url, uri)
    _refuse_stale_name(name, uri, optuna_url)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base_config.yaml").write_text(yaml.safe_dump(redact.strip(space.base), sort_keys=False))
    spec = {**to_dict(space.spec), "base": "base_config.yaml", "overrides": {}}
    spec["start_from"] = [*spec["start_from"], *(p for p in warm if p not in spec["start_from"])]
    (folder / "space.yaml").write_text(yaml.safe_dump(redact.strip(spec), sort_keys=False))
    base_storage = space.base_config.checkpoint.storage_path
    info = SweepInfo(name, str(folder), optuna_url, uri,
                     f"sweep-{name}", source=str(find_space(source).resolve()),
                     run_storage=f"{base_storage.rstrip('/')}/{name}" if "://" in base_storage else "")
    info.save()
    return info, load_space(str(folder / "space.yaml"))


def warm_points(warm_start: str, root: str, space: SearchSpace) -> list[dict[str, Any]]:
    """The sampled values of the best k completed trials of another sweep (``OTHER[:k]``),
    each checked against ``space``: a key it does not search, or a value outside it, is refused."""
    other, _, k = warm_start.partition(":")
    if k and (not k.isdigit() or int(k) < 1):
        raise ConfigError(f"--warm-start {warm_start}: expected SWEEP or SWEEP:k with k a positive integer")
    info, other_space = load_sweep(other, root)
    best = report.ranked(info.study(), other_space)[:int(k or WARM_START_TOP)]
    if not best:
        raise ConfigError(f"--warm-start {warm_start}: sweep {other!r} has no completed trial")
    points = [dict(trial.params) for trial in best]
    for trial, point in zip(best, points):
        try:
            check_point(space, point)
        except ConfigError as err:
            raise ConfigError(f"--warm-start {warm_start}: trial {trial.number} of {other!r} does not fit "
                              f"this space: {err}") from None
    return points


def extend(info: SweepInfo, space: SearchSpace, trials: int) -> SearchSpace:
    """Raise the sweep's total to ``trials`` (recorded in its ``space.yaml``); the new trials are
    asked of the same Optuna study, so they learn from the earlier ones."""
    started = len(info.study().get_trials(deepcopy=False))
    if trials < started:
        raise ConfigError(f"--trials {trials}: sweep {info.name!r} has already started {started} trials; "
                          f"give at least {started}")
    path = info.path / "space.yaml"
    spec = yaml.safe_load(path.read_text())
    spec["trials"] = trials
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_space(str(path))


def set_caps(info: SweepInfo, max_hours: float | None = None, max_device_hours: float | None = None,
             price: float | None = None) -> None:
    """Record the caps and price given (None keeps the recorded one) in ``sweep.json``."""
    given = {"--max-hours": max_hours, "--max-device-hours": max_device_hours, "--price": price}
    for flag, value in given.items():
        if value is not None and not value > 0:
            raise ConfigError(f"{flag} {value}: expected a number above 0")
    info.max_hours = info.max_hours if max_hours is None else max_hours
    info.max_device_hours = info.max_device_hours if max_device_hours is None else max_device_hours
    info.price_per_hour = info.price_per_hour if price is None else price
    info.save()


def _refuse_stale_name(name: str, tracking_uri: str, optuna_url: str) -> None:
    """A new sweep must not adopt what an earlier sweep of the same name left behind (its folder
    deleted, or a shared --storage): MLflow runs would replay as finished trials, Optuna trials
    would feed the sampler."""
    runs = tracking.count_runs(tracking_uri, f"sweep-{name}")
    if runs:
        raise ConfigError(f"sweep {name!r}: MLflow ({redact.redact(tracking_uri)}) already holds {runs} runs of an "
                          f"earlier sweep of that name (experiment 'sweep-{name}'); choose another "
                          "--name (or remove those runs from MLflow first)")
    if optuna_url.startswith("sqlite:///") and not Path(optuna_url[len("sqlite:///"):]).exists():
        return  # a fresh sweep folder: no study yet (and opening would create the file)
    studies = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(storage(optuna_url))}
    if studies.get(name):
        raise ConfigError(f"sweep {name!r}: the Optuna storage {redact.redact(optuna_url)} already holds a study "
                          f"{name!r} with {studies[name]} trials; resume it with `urm-ray sweep "
                          f"--resume {name}` (if its folder exists) or choose another --name")


def load_sweep(name: str, root: str = DEFAULT_ROOT, storage_url: str = "") -> tuple[SweepInfo, SearchSpace]:
    """A sweep as created. ``sweep.json`` holds no password: one comes back from ``storage_url``
    (``--storage``) and ``$MLFLOW_TRACKING_URI`` where they are the recorded URLs with a password
    (``redact.recall``), else from PGPASSWORD, ~/.pgpass or MLflow's own variables."""
    check_name("sweep name", name, SWEEP_MAX_LENGTH)
    folder = Path(root).resolve() / name
    if not (folder / INFO_FILE).is_file():
        known = sorted(p.parent.name for p in folder.parent.glob(f"*/{INFO_FILE}"))
        raise ConfigError(f"no sweep {name!r} in {folder.parent}; "
                          f"sweeps there: {', '.join(known) or 'none'}")
    info = SweepInfo.load(folder)
    redact.remember(storage_url)
    redact.remember(os.environ.get("MLFLOW_TRACKING_URI", ""))
    info.storage, info.tracking_uri = redact.recall(info.storage), redact.recall(info.tracking_uri)
    _check_databases(info.storage, info.tracking_uri)
    return info, load_space(str(folder / "space.yaml"))


def _check_databases(optuna_url: str, tracking_uri: str) -> None:
    """A database server that is down or misnamed, or one database for both, fails here, before
    Ray starts."""
    databases.check_separate(optuna_url, tracking_uri)
    databases.check_reachable(optuna_url, "the Optuna storage (--storage)")
    databases.check_reachable(tracking_uri, "the MLflow tracking store (tracking.tracking_uri or "
                                            "MLFLOW_TRACKING_URI)")


def run_sweep(info: SweepInfo, space: SearchSpace, resume: bool = False,
              callbacks: list[tune.Callback] | None = None, scale_up_s: float = 0.0,
              verbose: bool = False) -> SweepOutcome:
    """Run (or continue) the sweep to its number of trials, then write its report.

    ``callbacks``: extra Tune callbacks for a new sweep (a resumed one keeps its saved ones).
    ``scale_up_s`` > 0: first ask the autoscaler for ``concurrency`` trials (all of them when
    ``concurrency`` is 0) and wait that long for the nodes. ``verbose``: show the output of Ray and
    of the trials' workers (else only the trial table).
    """
    data_path, meta = prepare_data(space)
    if not ray.is_initialized():
        init_ray(verbose=verbose)
    try:
        check_nodes(info, space, data_path, grows=scale_up_s > 0)
    except ConfigError:
        if not resume:  # nothing ran: the same command, fixed, creates the sweep anew
            _discard(info)
        raise
    if not verbose:
        # Tune's new console output prints its experiment banner and TensorBoard hint even at
        # verbose=0; its legacy reporter, at verbose=0, prints nothing (read when fit starts)
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    wanted = space.spec.concurrency or space.spec.trials
    with scaled_up(trial_bundles(space.spec.resources, wanted), scale_up_s):
        return _run(info, space, resume, callbacks, data_path, meta)


def check_nodes(info: SweepInfo, space: SearchSpace, data_path: str, grows: bool = False) -> None:
    """On a cluster of several nodes, refuse a sweep whose data, Tune state or trial checkpoints
    would be on this node's disk (``cluster.check_reachable``): trial actors run on other nodes,
    and Tune stores its state and the one-worker trials' checkpoints where the trials' Train runs
    go (``SweepInfo.tune_storage``)."""
    storage = space.base_config.checkpoint.storage_path
    check_reachable({"data.path": (data_path, "the dataset"),
                     "checkpoint.storage_path": (info.run_storage or storage,
                                            f"Tune's state and the trials' checkpoints ({info.tune_path})")},
                    space.base_config.resources.shared_fs, grows)


def _discard(info: SweepInfo) -> None:
    """Remove what ``create_sweep`` wrote for a sweep that never ran."""
    for name in (INFO_FILE, "space.yaml", "base_config.yaml"):
        (info.path / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # a folder that held other files stays
        info.path.rmdir()


def _run(info: SweepInfo, space: SearchSpace, resume: bool, callbacks: list[tune.Callback] | None,
         data_path: str, meta: DatasetMeta) -> SweepOutcome:
    cluster = ray.cluster_resources()
    the_plan = plan(cluster, space.spec.resources, space.spec.concurrency, space.spec.trials)
    print(f"sweep {info.name}: {the_plan.describe(cluster)}", flush=True)
    info.trial_overrides = {**the_plan.train_overrides(), "data.path": data_path}
    info.parent_run_id = _open_parent(info, space, the_plan)
    info.started_at = time.time()
    info.save()
    ctx = TrialContext(info.name, space, _trial_extra(info), info.tracking_uri, info.experiment,
                       info.parent_run_id, meta)
    try:
        with heartbeat.beating(tracking.Run(info.tracking_uri, info.parent_run_id)):
            _fit(info, space, the_plan, ctx, resume, callbacks or [])
    finally:  # the wall time spent counts towards --max-hours on resume
        info.spent_s, info.started_at = info.elapsed_s(), 0.0
        info.save()
    outcome = finish(info, space)
    if outcome.interrupted:
        record_interrupted(ctx, info.study(), resume_hint(info.name))
    return outcome


def _fit(info: SweepInfo, space: SearchSpace, the_plan: Plan, ctx: TrialContext, resume: bool,
         callbacks: list[tune.Callback]) -> None:
    """Tune's ``fit``, started again from Tune's saved state when a fault of the cluster ends it.

    Tune's loop ends ``fit`` on some faults it could retry: an actor task killed by Ray's memory
    monitor (``OutOfMemoryError``) re-raised as "Caught unexpected exception". The sweep then goes
    on as ``--resume`` would, in this process: Tune's state brings its trials back, their
    checkpoints resume them, and the searcher takes over Optuna trials asked after the last save.
    It stops retrying after ``MAX_IDLE_RESTARTS`` restarts in a row that finished no trial.
    """
    idle, finished = 0, -1
    while True:
        try:
            _tuner(info, space, the_plan, ctx, resume, callbacks).fit()
            return
        except Exception as exc:
            fault = cluster_fault(exc)
            if fault is None or not tune.Tuner.can_restore(info.tune_path):
                raise
            now = _finished(info)
            idle = 0 if now > finished else idle + 1
            if idle > MAX_IDLE_RESTARTS:
                raise
            finished, resume = now, True
            print(f"sweep {info.name}: Tune stopped on a fault of the cluster "
                  f"({type(fault).__name__}: {str(fault).splitlines()[0]}); {now} trials finished; "
                  "going on from Tune's saved state", flush=True)


def cluster_fault(exc: BaseException) -> RayError | None:
    """The Ray error (a killed worker, a lost node) that caused ``exc``, if any."""
    seen: BaseException | None = exc
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:  # a chain may loop back on itself
        if isinstance(seen, RayError):
            return seen
        visited.add(id(seen))
        seen = seen.__cause__ or seen.__context__
    return None


def _finished(info: SweepInfo) -> int:
    return sum(t.state.is_finished() for t in info.study().get_trials(deepcopy=False))


def resume_hint(name: str) -> str:
    return f"resume with `urm-ray sweep --resume {name}`"


def finish(info: SweepInfo, space: SearchSpace) -> SweepOutcome:
    """Leaderboard, best config and plots into the sweep folder and the parent run."""
    study = info.study()
    finished = sum(t.state.is_finished() for t in study.trials)
    costs = cost.trial_costs(info)
    best = report.write_report(study, space, info, costs)
    tracking.Run(info.tracking_uri, info.parent_run_id).log_metrics(cost.sweep_cost(info, costs))
    capped = cost.cap_reached(info) if finished < space.spec.trials else ""
    status = "FINISHED" if finished >= space.spec.trials or capped else "KILLED"
    tracking.Run(info.tracking_uri, info.parent_run_id).close(status)
    return SweepOutcome(info.name, finished, space.spec.trials, best.values[0] if best else None,
                        str(info.path / report.BEST_FILE) if best else None, capped)


def _open_parent(info: SweepInfo, space: SearchSpace, the_plan: Plan) -> str:
    params: dict[str, Any] = {
        "space": info.source, "trials": space.spec.trials, "concurrency": the_plan.concurrency,
        "objectives": ", ".join(f"{o.metric} ({o.mode})" for o in space.spec.objectives),
        "scheduler": space.spec.scheduler.name, "sampler": space.spec.search.sampler,
        "seed": space.spec.search.seed,
    }
    for param in space.params:
        params[f"searched.{param.key}"] = report.describe_param(param)
    tags = {KIND_TAG: "sweep", SWEEP_TAG: info.name}
    heartbeat.warn_if_lost(tracking.find_summary(info.tracking_uri, info.experiment, info.name))
    return tracking.open_run(info.tracking_uri, info.experiment, info.name, params, tags)


def prepare_data(space: SearchSpace) -> tuple[str, DatasetMeta]:
    """The dataset path every trial gets, and its metadata, read once here for every trial (a
    trial on another node reads only the data files).

    A built-in dataset is built here, once, rather than by concurrent trials; a local path is
    made absolute, since Tune runs each trial in its own working directory.
    """
    path = space.base_config.data.path
    resolved = builtin.resolve_path(path)
    meta = stream.load_meta(replace(space.base_config.data, path=resolved))  # missing data fails now
    if path.startswith(builtin.PREFIX) or "://" in path:
        return path, meta
    return str(Path(path).resolve()), meta


def _trial_extra(info: SweepInfo) -> dict[str, Any]:
    return {**info.trial_overrides, "checkpoint.storage_path": info.runs_path("trials"),
            "tracking.tracking_uri": info.tracking_uri, "tracking.experiment": info.experiment}


def make_scheduler(space: SearchSpace, info: SweepInfo) -> TrialScheduler:
    """ASHA / median stopping / none, all in training steps (the ``step`` every report has)."""
    spec, train = space.spec.scheduler, space.base_config.train
    grace = spec.grace_steps or space.base_config.eval.every or train.log_every
    objectives = space.spec.objectives
    if spec.name == "asha" and len(objectives) > 1:  # Pareto dominance at each rung
        return StudyDominance([o.metric for o in objectives], [o.mode for o in objectives],
                              max_t=train.steps, grace=grace, rf=spec.reduction_factor,
                              storage_url=info.storage, study_name=info.name)
    if spec.name == "asha":  # its rungs are read back from the study after a restart
        return StudyASHA(space.metric, space.mode, max_t=train.steps, grace=grace,
                         rf=spec.reduction_factor, storage_url=info.storage, study_name=info.name)
    if spec.name == "median":
        return MedianStoppingRule(time_attr="step", metric=space.metric, mode=space.mode,
                                  grace_period=grace, min_samples_required=3)
    return FIFOScheduler()


def trial_dirname(trial: Any) -> str:
    return f"t{int(trial.config[TRIAL_KEY]):03d}"


def _tuner(info: SweepInfo, space: SearchSpace, the_plan: Plan, ctx: TrialContext,
           resume: bool, callbacks: list[tune.Callback]) -> tune.Tuner:
    # a one-worker trial reports its checkpoints to Tune from the first one on, before its first
    # evaluation gives Tune's scheduler and searcher an objective (they skip such results)
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    trainable = tune.with_resources(partial(run_trial, ctx=ctx), the_plan.trial_resources())
    path = info.tune_path
    if resume and tune.Tuner.can_restore(path):
        cost.reopen(Path(path), space.spec.trials)  # an extended total, or larger caps
        # with retries, a trial that failed (its node preempted) restarts from its checkpoint too
        return tune.Tuner.restore(path, trainable, resume_unfinished=True,
                                  resume_errored=space.retries > 0)
    sampler = make_sampler(space)
    searcher = cost.CappedSearch(space, storage(info.storage), info.name, sampler,
                                 pruned_as=space.spec.search.pruned_as, folder=info.folder)
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher, scheduler=make_scheduler(space, info), num_samples=space.spec.trials,
            max_concurrent_trials=the_plan.concurrency, trial_dirname_creator=trial_dirname,
            trial_name_creator=trial_dirname,
            reuse_actors=True,  # a trial actor trains the next trial: no process start, no imports
        ),
        run_config=tune.RunConfig(
            name="tune", storage_path=info.tune_storage, verbose=0,
            # one-worker trials checkpoint through Tune (``tune.trial_host.TrialHost``)
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=space.base_config.checkpoint.keep),
            # a failed trial restarts; its Ray Train run resumes from its latest checkpoint
            failure_config=tune.FailureConfig(max_failures=space.retries),
            callbacks=[FateRecorder(ctx, space.spec.scheduler.name),
                       TrialTable(space.metric, space.mode, space.steps, space.spec.trials,
                                  objectives=space.spec.objectives),
                       *callbacks],
        ),
    )
