"""What the HTML report of a sweep shows, gathered from its Optuna study: no plotting here.

    data = sweep_data(study, space, costs=cost.trial_costs(info), run_ids=...)

Every number comes from the study (objective values, evaluations at each step, fates, start and
end times) and the trials' ``cost/device_seconds``; none from Tune's state, so a sweep's report
can be rebuilt at any time after it ran (``urm-ray report NAME``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from urm_ray.tune import pareto
from urm_ray.tune.cost import DEVICE_SECONDS
from urm_ray.tune.rungs import milestones
from urm_ray.tune.search import EVALS_ATTR, FATE_ATTR
from urm_ray.tune.space import SearchSpace

MIN_FOR_IMPORTANCE = 2  # completed trials Optuna's importance evaluator needs


@dataclass
class TrialData:
    number: int
    fate: str  # completed, pruned, failed, running, ...
    curve: list[tuple[int, float]]  # (training step, primary objective) at each evaluation
    values: list[float] | None  # final objective values (completed trials only)
    device_hours: float | None  # from cost/device_seconds; None when the trial logged none
    wall_hours: float  # from the trial's start to its end (or now, if it has not ended)


@dataclass
class SweepData:
    name: str
    metrics: list[str]  # the objectives, primary first
    modes: list[str]  # "max" / "min" per objective
    trials: list[TrialData]
    rungs: list[int]  # ASHA's rung steps, lowest first (empty without ASHA)
    importances: dict[str, float]  # parameter -> importance (empty below MIN_FOR_IMPORTANCE)
    front: list[int]  # trial numbers on the Pareto front (several objectives only)
    leaderboard: list[dict[str, Any]] = field(default_factory=list)

    @property
    def metric(self) -> str:
        return self.metrics[0]

    def stopped_at(self, trial: TrialData) -> int | None:
        """The rung a pruned trial stopped at: the highest rung at or below its last evaluation."""
        if trial.fate != "pruned" or not trial.curve or not self.rungs:
            return None
        last = trial.curve[-1][0]
        reached = [r for r in self.rungs if r <= last]
        return reached[-1] if reached else None


def sweep_data(name: str, study: optuna.Study, space: SearchSpace,
               costs: dict[int, dict[str, float]] | None = None,
               leaderboard: list[dict[str, Any]] | None = None) -> SweepData:
    costs = costs or {}
    trials = [_trial(t, costs.get(t.number, {})) for t in sorted(study.trials, key=lambda t: t.number)]
    sched, train = space.spec.scheduler, space.base_config.train
    rungs = []
    if sched.name == "asha":
        rungs = milestones(sched.grace_steps or space.base_config.eval.every or train.log_every, train.steps,
                           sched.reduction_factor)
    objectives = space.spec.objectives
    front = [t.number for t in pareto.pareto_front(study.trials, objectives)] if len(objectives) > 1 else []
    return SweepData(name, [o.metric for o in objectives], [o.mode for o in objectives], trials, rungs,
                     importances(study), front, leaderboard or [])


def _trial(trial: FrozenTrial, cost: dict[str, float]) -> TrialData:
    if trial.intermediate_values:
        curve = sorted((int(s), float(v)) for s, v in trial.intermediate_values.items())
    else:  # a multi-objective trial keeps its evaluations in a user attribute
        evals = trial.user_attrs.get(EVALS_ATTR, {})
        curve = sorted((int(s), float(v[0])) for s, v in evals.items())
    values = list(trial.values) if trial.state == TrialState.COMPLETE and trial.values else None
    device_s = cost.get(DEVICE_SECONDS)
    wall_s = 0.0
    if trial.datetime_start is not None and trial.datetime_complete is not None:
        wall_s = (trial.datetime_complete - trial.datetime_start).total_seconds()
    return TrialData(trial.number, trial.user_attrs.get(FATE_ATTR, trial.state.name.lower()), curve,
                     values, None if device_s is None else device_s / 3600, wall_s / 3600)


def importances(study: optuna.Study) -> dict[str, float]:
    """Optuna's parameter importances for the primary objective, once enough trials completed;
    empty where the evaluator cannot tell (e.g. every sampled value the same)."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < MIN_FOR_IMPORTANCE:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = optuna.importance.get_param_importances(study, target=lambda t: t.values[0])
    except (ValueError, RuntimeError, ZeroDivisionError):
        return {}
    return {k: float(v) for k, v in found.items() if not math.isnan(v)}


def best_so_far(data: SweepData, by: str) -> tuple[list[float], list[float], str]:
    """The best primary value after each finished trial, against trial number (``by="trial"``)
    or against the device-hours spent so far (``by="cost"``; wall hours when the trials logged no
    ``cost/device_seconds``). Returns x, y and the x axis label."""
    sign = 1.0 if data.modes[0] == "max" else -1.0
    measured = all(t.device_hours is not None for t in data.trials if t.values)
    xs, ys, spent, best = [], [], 0.0, None
    for trial in data.trials:
        spent += (trial.device_hours if measured else trial.wall_hours) or 0.0
        if trial.values is None or math.isnan(trial.values[0]):
            continue
        value = trial.values[0]
        best = value if best is None or sign * value > sign * best else best
        xs.append(float(trial.number) if by == "trial" else spent)
        ys.append(best)
    label = "trial" if by == "trial" else ("device-hours" if measured else "wall hours (no cost/device_seconds)")
    return xs, ys, label


def seed_curves(tracking_uri: str, run_ids: list[str], metric: str) -> list[list[tuple[int, float]]]:
    """One curve of ``metric`` per run (a study row's final runs, one per seed), from MLflow."""
    from urm_ray import tracking

    return [tracking.Run(tracking_uri, run_id).metric_history(metric) for run_id in run_ids]
