"""Reuse a sweep: export its best config; re-run the top configs over seeds; train the winner.

    urm-ray best NAME                        print the best config, write <sweep>/best_config.yaml
    urm-ray final NAME --seeds 3 resources.num_workers=2
    urm-ray best NAME --pick 5               several objectives: the Pareto front, trial 5's config
    urm-ray final NAME --pick 5              train the front's trial 5

``final`` re-trains the sweep's top configs (``--top``, default from the space) at the sweep's
trial length with ``--seeds`` new seeds each, because one short run of a config varies by about
two points; the config with the best mean then trains once at full length (the space's ``final``
overrides, then the command line's), logged under the sweep's parent run, and its EMA model is
registered in the MLflow Model Registry with its config and metrics. Each stage is logged as it
starts; the re-check shows its runs (``final_view``), the final run the bar of ``urm-ray train``.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import ray
from optuna.trial import FrozenTrial
from ray import tune

from urm_ray import tracking
from urm_ray.cluster import init_ray, scaled_up
from urm_ray.data.tasks import registry
from urm_ray.config import RunConfig, apply_overrides, build_config, dump_yaml, with_values
from urm_ray.errors import ConfigError, Interrupted
from urm_ray.names import check_name
from urm_ray.progress import Progress
from urm_ray.tracking import KIND_TAG, SWEEP_TAG, TRIAL_TAG
from urm_ray.tune import pareto
from urm_ray.tune.final_view import RecheckProgress, run_label
from urm_ray.tune.info import SweepInfo
from urm_ray.tune.report import BEST_FILE, best_config, ranked
from urm_ray.tune.resources import trial_bundles, without_resources
from urm_ray.tune.space import SearchSpace
from urm_ray.tune.sweep import DEFAULT_ROOT, load_sweep
from urm_ray.typed import to_dict

logger = logging.getLogger(__name__)


@dataclass
class FinalOutcome:
    winner: int  # Optuna trial number
    scores: dict[int, list[float]]  # trial -> primary metric per seed
    metrics: dict[str, Any]  # the final run's last metrics
    run_id: str | None
    model_name: str
    model_version: str | None


def top_trials(info: SweepInfo, space: SearchSpace, count: int, pick: int | None = None) -> list[FrozenTrial]:
    """The ``count`` best completed trials by the first objective; with several objectives, the
    Pareto front's, or the front's trial ``pick`` alone (a trial off the front is refused)."""
    study = info.study()
    if pick is not None:
        return [pareto.pick(study.trials, space.spec.objectives, pick)]
    if len(space.spec.objectives) > 1:
        trials = pareto.pareto_front(study.trials, space.spec.objectives)[:count]
    else:
        trials = ranked(study, space)[:count]
    if not trials:
        raise ConfigError(f"sweep {info.name!r} has no completed trial yet")
    return trials


def front_table(name: str, root: str = DEFAULT_ROOT) -> str:
    """The Pareto front of a sweep with several objectives as a table ("" with one objective)."""
    info, space = load_sweep(name, root)
    if len(space.spec.objectives) < 2:
        return ""
    front = pareto.pareto_front(info.study().trials, space.spec.objectives)
    return pareto.describe(front, space.spec.objectives, [p.key for p in space.params])


def export_best(name: str, root: str = DEFAULT_ROOT, out: str = "",
                pick: int | None = None) -> tuple[FrozenTrial, Path, str]:
    """The best trial (or the Pareto front's trial ``pick``), the file its config was written to,
    and that YAML."""
    info, space = load_sweep(name, root)
    trial = top_trials(info, space, 1, pick)[0]
    text = dump_yaml(best_config(space, trial, info.trial_overrides))
    path = Path(out) if out else info.path / BEST_FILE
    path.write_text(text)
    return trial, path, text


@dataclass(frozen=True)
class FinalRequest:
    """What ``final`` trains. ``top``/``seeds`` 0: the space's ``final`` section. ``pick``: the
    Pareto front's trial to train (re-checked over its seeds alone); without it a sweep with
    several objectives re-checks the front's most accurate ``top`` members. ``overrides``: applied
    to the winner's run at full length. ``model_name``: the registered model (default
    ``urm-ray-NAME``)."""

    seeds: int = 0
    top: int = 0
    pick: int | None = None
    overrides: tuple[str, ...] = ()
    model_name: str = ""


@dataclass(frozen=True)
class Launch:
    """How a stage runs on the cluster. ``scale_up_s`` > 0: ask the autoscaler for the nodes of
    each stage and wait that long. ``verbose``: show Ray's output. ``live``: progress bars on
    stderr (a terminal), else lines."""

    scale_up_s: float = 0.0
    verbose: bool = False
    live: bool = False


def final(name: str, root: str = DEFAULT_ROOT, request: FinalRequest = FinalRequest(),
          launch: Launch = Launch()) -> FinalOutcome:
    """Re-evaluate the top configs over seeds, train the winner at full length, register it."""
    pick, top, model_name = request.pick, request.top, request.model_name
    if pick is not None and top:
        raise ConfigError(f"--pick {pick} and --top {top}: --pick trains one chosen trial, --top "
                          "re-checks the best ones; give one of them")
    if model_name:  # registered at the very end: checked before anything trains
        check_name("--model-name", model_name)
    info, space = load_sweep(name, root)
    if space.evaluates:
        raise ConfigError(f"sweep {name} is an evaluation sweep: its best settings need no training; "
                          f"`urm-ray best {name}` prints them, `urm-ray eval {space.spec.checkpoint} --width ...` "
                          "applies them")
    candidates = top_trials(info, space, top or space.spec.final.top, pick)
    seeds = request.seeds or space.spec.final.seeds
    if not ray.is_initialized():
        init_ray(verbose=launch.verbose)
    parent = tracking.Run.open(
        info.tracking_uri, info.experiment, f"{name}-final",
        {"top": len(candidates), "seeds": seeds, "overrides": " ".join(request.overrides)},
        {tracking.PARENT_TAG: info.parent_run_id, KIND_TAG: "final", SWEEP_TAG: name},
    )
    if len(candidates) > 1 or seeds > 1:
        bundles = trial_bundles(space.spec.resources, len(candidates) * seeds)
        with scaled_up(bundles, launch.scale_up_s):
            scores = reevaluate(info, space, candidates, seeds, parent, launch.live)
    else:
        logger.info("final: one config, one seed: its sweep result %s = %s stands, no re-check",
                    space.metric, candidates[0].values[0])
        scores = {candidates[0].number: [candidates[0].values[0]]}
    sign = 1.0 if space.mode == "max" else -1.0
    winner = max(candidates, key=lambda t: sign * statistics.fmean(scores[t.number]))
    logger.info("final stage 2/2: training the winner t%03d (mean %s %.4f over %d seed(s))", winner.number,
                space.metric, statistics.fmean(scores[winner.number]), len(scores[winner.number]))
    outcome = _train_winner(info, space, winner, list(request.overrides), parent,
                            model_name or f"urm-ray-{name}", launch)
    outcome.scores = scores
    _log_scores(info, space, parent, scores, winner.number)
    parent.close("FINISHED")
    return outcome


def _seed_config(info: SweepInfo, space: SearchSpace, trial: FrozenTrial, seed: int) -> RunConfig:
    return space.trial_config(dict(trial.params), {
        **info.trial_overrides, "train.seed": seed, "data.shuffle_seed": seed,
        "train.run_name": f"{info.name}-final-t{trial.number:03d}-s{seed}",
        "checkpoint.storage_path": info.runs_path("final"), "tracking.tracking_uri": info.tracking_uri,
        "tracking.experiment": info.experiment,
    })


def _seed_run(config: dict[str, Any], runs: dict[str, tuple[int, dict[str, Any]]],
              tags: dict[str, str], metric: str) -> None:
    """Tune trainable: one (candidate, seed) run, reporting its final metric (a one-worker run
    trains in the trial actor and reports each evaluation)."""
    from urm_ray.train.driver import fit
    from urm_ray.tune.trial_host import in_sweep

    number, data = runs[config["run"]]
    cfg, tags = build_config(data), {**tags, TRIAL_TAG: str(number)}
    to_tune = lambda metrics, _: {metric: metrics[metric]} if metric in metrics else None  # noqa: E731
    result = fit(cfg, tags=tags, sweep=in_sweep(to_tune))
    if cfg.resources.num_workers > 1:
        ray.tune.report({metric: result.metrics.get(metric, float("nan"))})


def reevaluate(info: SweepInfo, space: SearchSpace, candidates: list[FrozenTrial], seeds: int,
                parent: tracking.Run, live: bool = False) -> dict[int, list[float]]:
    """Each candidate at the sweep's trial length with seeds base+1..base+K, run like trials."""
    from urm_ray.tune.resources import plan

    base_seed = space.base_config.train.seed
    runs = {f"t{t.number}-s{s}": (t, _seed_config(info, space, t, base_seed + 1 + s))
            for t in candidates for s in range(seeds)}
    labels = {f"t{t.number}-s{s}": run_label(rank, len(candidates), t.number, s + 1)
              for rank, t in enumerate(candidates, 1) for s in range(seeds)}
    the_plan = plan(ray.cluster_resources(), space.spec.resources, 0, len(runs))
    logger.info("final stage 1/2: re-checking the top %d config(s) (%s) with %d seed(s) each: %d runs "
                "of %d steps, %d at a time", len(candidates),
                ", ".join(f"t{t.number:03d}" for t in candidates), seeds, len(runs),
                space.base_config.train.steps, the_plan.concurrency)
    trainable = partial(_seed_run, runs={k: (t.number, to_dict(c)) for k, (t, c) in runs.items()},
                        tags={tracking.PARENT_TAG: parent.id, KIND_TAG: "seed", SWEEP_TAG: info.name},
                        metric=space.metric)
    grid = tune.Tuner(
        tune.with_resources(trainable, the_plan.trial_resources()),
        param_space={"run": tune.grid_search(list(runs))},
        tune_config=tune.TuneConfig(max_concurrent_trials=the_plan.concurrency),
        run_config=tune.RunConfig(name="final-seeds", storage_path=str(info.path), verbose=0,
                                  callbacks=[RecheckProgress(labels, space.metric, live)]),
    ).fit()
    # Ctrl-C: Tune stops the grid and returns; a run it stopped (or never started) is not done
    if any(r.error is None and not (r.metrics or {}).get("done") for r in grid):
        parent.close("KILLED")
        logger.warning("final %s stopped during its re-check; `urm-ray final %s` starts it again",
                       info.name, info.name)
        raise Interrupted()
    scores: dict[int, list[float]] = {t.number: [] for t in candidates}
    for result in grid:
        if result.error is not None:
            raise RuntimeError(f"re-evaluation run {result.config['run']} failed: {result.error}")
        scores[runs[result.config["run"]][0].number].append(float(result.metrics[space.metric]))
    return scores


def _train_winner(info: SweepInfo, space: SearchSpace, winner: FrozenTrial, overrides: list[str],
                  parent: tracking.Run, model_name: str, launch: Launch) -> FinalOutcome:
    from urm_ray.train.driver import fit
    from urm_ray.evaluate import load_checkpoint

    # the trials' resources stay behind: the run at full length gets the base config's, the
    # space's final overrides or the command line's
    data = with_values(space.base, {**dict(winner.params), **without_resources(info.trial_overrides),
                                    **space.spec.final.overrides})
    data = apply_overrides(data, [*overrides, f"train.run_name={info.name}-final-t{winner.number:03d}",
                                  f"checkpoint.storage_path={info.runs_path('final')}",
                                  f"tracking.tracking_uri={info.tracking_uri}",
                                  f"tracking.experiment={info.experiment}"])
    cfg = build_config(data)
    tags = {tracking.PARENT_TAG: parent.id, KIND_TAG: "final", SWEEP_TAG: info.name,
            TRIAL_TAG: str(winner.number)}
    params = {f"sampled.{k}": v for k, v in winner.params.items()}
    with Progress(f"final t{winner.number:03d}", cfg.train.steps, unit="steps", live=launch.live) as progress:
        result = fit(cfg, tags=tags, params=params, scale_up_s=launch.scale_up_s, progress=progress)
        version = None
        if result.checkpoint_path and result.mlflow_run_id:
            logger.info("final: registering its model as %r", model_name)
            progress.phase(f"registering the model as {model_name}")
            run_cfg, model = load_checkpoint(result.checkpoint_path)  # EMA weights when kept
            version = _register(info, run_cfg, model, result.mlflow_run_id, result.metrics, model_name)
        progress.phase("done")
    return FinalOutcome(winner.number, {}, result.metrics, result.mlflow_run_id, model_name, version)


def _register(info: SweepInfo, cfg: RunConfig, model: Any, run_id: str, metrics: dict[str, Any],
              model_name: str) -> str:
    tags = {k: str(v) for k, v in metrics.items() if k.startswith(registry.HELD_OUT_PREFIXES)}
    tags.update({"sweep": info.name, "sweep_parent_run_id": info.parent_run_id})
    with tempfile.TemporaryDirectory() as folder:
        config_file = Path(folder) / "config.yaml"
        config_file.write_text(dump_yaml(cfg))
        return tracking.Run(info.tracking_uri, run_id).register_torch_model(model, model_name,
                                                                           [str(config_file)], tags)


def _log_scores(info: SweepInfo, space: SearchSpace, parent: tracking.Run, scores: dict[int, list[float]],
                winner: int) -> None:
    metrics = {}
    for number, values in scores.items():
        metrics[f"t{number:03d}/mean"] = statistics.fmean(values)
        metrics[f"t{number:03d}/std"] = statistics.pstdev(values)
    parent.log_metrics(metrics)
    parent.set_tags({"urm_ray.winner": str(winner), "urm_ray.metric": space.metric})

