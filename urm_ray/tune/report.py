"""What a finished sweep leaves behind: leaderboard, best config and Optuna's plots.

Written into the sweep folder and uploaded to the sweep's parent MLflow run:
``leaderboard.csv`` (every trial: fate, objective values, last step, sampled values, MLflow run
id; with several objectives a ``pareto`` column marks the front's members), ``pareto.csv`` (the
front, with several objectives), ``best_config.yaml`` (a training config ``urm-ray train`` accepts, without the resources
the sweep gave each trial), ``plots/*.png`` (optimization history, parameter importances,
parallel coordinates, slices). The HTML page drawn from them is ``urm_ray/report/``'s, above this
package.
"""

from __future__ import annotations

import csv
import logging
import warnings
from pathlib import Path
from typing import Any

import matplotlib
import optuna
from optuna.trial import FrozenTrial, TrialState

from urm_ray import tracking
from urm_ray.config import RunConfig, dump_yaml
from urm_ray.tracking import TRIAL_TAG
from urm_ray.tune import pareto
from urm_ray.tune.expr import Expr
from urm_ray.tune.info import SweepInfo
from urm_ray.tune.params import Param
from urm_ray.tune.resources import without_resources
from urm_ray.tune.search import FATE_ATTR
from urm_ray.tune.space import SearchSpace

matplotlib.use("Agg")  # files only, never a window
logger = logging.getLogger(__name__)

BEST_FILE = "best_config.yaml"
LEADERBOARD_FILE = "leaderboard.csv"
PLOTS = ("optimization_history", "param_importances", "parallel_coordinate", "slice")


def describe_param(param: Param) -> str:
    if param.kind == "categorical":
        return f"categorical {list(param.choices)}"
    bounds = [b.text if isinstance(b, Expr) else b for b in (param.low, param.high)]
    return f"{param.kind} [{bounds[0]}, {bounds[1]}]"


def ranked(study: optuna.Study, space: SearchSpace) -> list[FrozenTrial]:
    """Completed trials, best first by the primary objective."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    sign = -1.0 if space.mode == "max" else 1.0
    return sorted(done, key=lambda t: (sign * t.values[0], t.number))


def best_config(space: SearchSpace, trial: FrozenTrial, overrides: dict[str, Any]) -> RunConfig:
    """The winning trial as a standalone training config: its sampled values and the sweep's
    ``overrides`` without the per-trial resources (fitted to run trials side by side on the
    sweep's cluster), so the base config's resources apply, or those given to final training."""
    return space.trial_config(dict(trial.params), without_resources(overrides))


def leaderboard(study: optuna.Study, space: SearchSpace, run_ids: dict[int, str],
                costs: dict[int, dict[str, float]] | None = None) -> list[dict[str, Any]]:
    """One row per trial, best first; ``costs``: trial number -> its ``cost/*`` metrics."""
    costs = costs or {}
    order = {t.number: i for i, t in enumerate(ranked(study, space))}
    multi = len(space.spec.objectives) > 1
    front = {t.number for t in pareto.pareto_front(study.trials, space.spec.objectives)} if multi else set()
    rows = []
    for trial in sorted(study.trials, key=lambda t: (order.get(t.number, len(order)), t.number)):
        row: dict[str, Any] = {
            "rank": order[trial.number] + 1 if trial.number in order else "",
            "trial": trial.number,
            "fate": trial.user_attrs.get(FATE_ATTR, trial.state.name.lower()),
            "last_step": trial.user_attrs.get("last_step", ""),
        }
        if multi:  # a member of the Pareto front
            row["pareto"] = "yes" if trial.number in front else ""
        for i, objective in enumerate(space.spec.objectives):
            row[objective.metric] = trial.values[i] if trial.values else ""
        row.update({p.key: trial.params.get(p.key, "") for p in space.params})
        duration = trial.duration.total_seconds() if trial.duration else ""
        device_s = costs.get(trial.number, {}).get("cost/device_seconds")
        row.update({"duration_s": duration, "device_hours": "" if device_s is None else device_s / 3600,
                    "mlflow_run_id": run_ids.get(trial.number, "")})
        rows.append(row)
    return rows


def write_report(study: optuna.Study, space: SearchSpace, info: SweepInfo,
                 costs: dict[int, dict[str, float]] | None = None) -> FrozenTrial | None:
    """Write and upload the report; returns the best completed trial (None if there is none)."""
    runs = tracking.child_runs(info.tracking_uri, info.experiment, info.parent_run_id)
    parent = tracking.Run(info.tracking_uri, info.parent_run_id)
    run_ids = {int(r.tags[TRIAL_TAG]): r.run_id for r in runs if TRIAL_TAG in r.tags}
    rows = leaderboard(study, space, run_ids, costs)
    _write_csv(rows, info.path / LEADERBOARD_FILE)
    files = [info.path / LEADERBOARD_FILE]
    best = next(iter(ranked(study, space)), None)
    if best is not None:
        (info.path / BEST_FILE).write_text(dump_yaml(best_config(space, best, info.trial_overrides)))
        files.append(info.path / BEST_FILE)
        best_values = {f"best/{o.metric}": v for o, v in zip(space.spec.objectives, best.values)}
        parent.log_metrics(best_values)
        parent.set_tags({"urm_ray.best_trial": str(best.number)})
    if len(space.spec.objectives) > 1:
        files.append(write_front(study, space, info, run_ids))
    for path in files:
        parent.log_artifact(path)
    plots = write_plots(study, space, info.path / "plots")
    if plots:
        parent.log_artifact(info.path / "plots", "plots")
    return best


def write_front(study: optuna.Study, space: SearchSpace, info: SweepInfo, run_ids: dict[int, str]) -> Path:
    """``pareto.csv`` in the sweep folder, and ``urm_ray.pareto`` true/false on every trial's run
    (false too: a trial may leave the front as a resumed sweep finishes more trials)."""
    objectives, keys = space.spec.objectives, [p.key for p in space.params]
    front = pareto.pareto_front(study.trials, objectives)
    path = info.path / pareto.PARETO_FILE
    header = ["trial", *(o.metric for o in objectives), *keys]
    pareto.write_csv(pareto.rows(front, objectives, keys), header, path)
    members = {t.number for t in front}
    for number, run_id in sorted(run_ids.items()):
        tracking.Run(info.tracking_uri, run_id).set_tags({pareto.PARETO_TAG: str(number in members).lower()})
    return path


def _write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    fields = list(rows[0]) if rows else ["trial"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def write_plots(study: optuna.Study, space: SearchSpace, folder: Path) -> list[Path]:
    """Optuna's matplotlib plots as PNGs; a plot the study cannot support yet is skipped."""
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as views

    folder.mkdir(exist_ok=True)
    kwargs = {"target": lambda t: t.values[0], "target_name": space.metric}
    written = []
    for name in PLOTS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib views experimental
                axes = getattr(views, f"plot_{name}")(study, **kwargs)
        except (ValueError, RuntimeError, ImportError, ZeroDivisionError) as err:
            logger.warning("plot %s skipped: %s", name, err)
            continue
        figure = axes.flat[0].figure if hasattr(axes, "flat") else axes.figure
        figure.savefig(folder / f"{name}.png", dpi=110, bbox_inches="tight")
        plt.close(figure)
        written.append(folder / f"{name}.png")
    if len(space.spec.objectives) > 1 and any(t.state == TrialState.COMPLETE for t in study.trials):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            axes = views.plot_pareto_front(study, target_names=[o.metric for o in space.spec.objectives])
        axes.figure.savefig(folder / "pareto_front.png", dpi=110, bbox_inches="tight")
        plt.close(axes.figure)
        written.append(folder / "pareto_front.png")
    return written
