"""The Optuna searcher of a sweep: Ray's ``OptunaSearch`` with pruning and resume done right.

What changes against ``ray.tune.search.optuna.OptunaSearch``:

- A trial that Tune stopped early (ASHA, median stopping) is told to Optuna as PRUNED, with the
  evaluations it reached as intermediate values. Ray's searcher tells it COMPLETE with its early
  value, so TPE learns from a short run as if it were a full one and favours configurations
  that merely start fast. ``pruned_as="complete"`` keeps Ray's behaviour (for the benchmark).
- Intermediate values are reported at training steps (``step``), and only when the metric is
  present: before the first evaluation the reports carry no ``eval/*`` values.
- With several objectives the study has one direction each and TPE samples multi-objective
  (its model ranks completed trials by non-dominated sorting); a trial stopped early is PRUNED,
  so it never becomes a point of the Pareto front, and its evaluations go to ``EVALS_ATTR``.
- Each suggestion carries the Optuna trial number (``TRIAL_KEY``), the identity of the trial
  everywhere: its Ray Train run name and its MLflow run name derive from it.
- Resume after a killed driver: Optuna trials asked after Tune's last experiment checkpoint
  stay RUNNING in the study, unknown to the restored Tune state. The next suggestions take them
  over (same number, same parameters) instead of asking new ones, so the study ends with exactly
  the requested number of trials, and the taken-over trial continues its own Train checkpoint
  and MLflow run.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

import optuna
from optuna.trial import TrialState
from ray.tune.search.optuna import OptunaSearch

from urm_ray.tune.space import SearchSpace

logger = logging.getLogger(__name__)

TRIAL_KEY = "trial_number"  # in every trial's Tune config: the Optuna trial number
FATE_ATTR = "fate"  # Optuna user attribute: completed, pruned, failed
EVALS_ATTR = "evals"  # Optuna user attribute of a multi-objective trial: step -> objective values


def make_sampler(space: SearchSpace, kind: str | None = None) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, constant liar for parallel trials) or random, seeded by the space."""
    search = space.spec.search
    if (kind or search.sampler) == "random":
        return optuna.samplers.RandomSampler(seed=search.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=search.seed, n_startup_trials=search.startup_trials, multivariate=True,
            constant_liar=True,
        )


class SweepSearch(OptunaSearch):
    """``OptunaSearch`` over a SearchSpace; see the module docstring for what it changes."""

    def __init__(self, space: SearchSpace, storage: optuna.storages.BaseStorage, study_name: str,
                 sampler: optuna.samplers.BaseSampler, pruned_as: str = "pruned") -> None:
        metrics = [o.metric for o in space.spec.objectives]
        modes = [o.mode for o in space.spec.objectives]
        multi = len(metrics) > 1
        super().__init__(
            space=DefineByRun(space), metric=metrics if multi else metrics[0],
            mode=modes if multi else modes[0], sampler=sampler, study_name=study_name,
            storage=storage,
        )
        self.full_steps = space.steps
        self.pruned_as = pruned_as
        self._orphans: list[int] | None = None  # study trial ids no Tune trial owns (see _orphan)
        self._enqueue(space)

    def _enqueue(self, space: SearchSpace) -> None:
        for point in space.spec.start_from:
            self._ot_study.enqueue_trial(point, skip_if_exists=True)

    def suggest(self, trial_id: str) -> dict | None:
        if trial_id not in self._ot_trials:
            orphan = self._orphan()
            if orphan is not None:
                logger.info("Tune trial %s takes over Optuna trial %d", trial_id, orphan.number)
                self._ot_trials[trial_id] = orphan
        return super().suggest(trial_id)

    def _orphan(self) -> optuna.Trial | None:
        """The first study trial that no Tune trial owns (asked after Tune's last checkpoint).

        RUNNING ones continue from their Train checkpoint; finished ones are recognised by the
        trial function from their MLflow fate and not trained again. Only trials asked before
        this searcher started (or was restored) can be orphans, so the study is read once, at
        the first suggestion, not at every one (a read of every trial each: quadratic in a sweep).
        """
        if self._orphans is None:
            owned = {t.number for t in self._ot_trials.values()}
            self._orphans = [frozen._trial_id for frozen in self._ot_study.get_trials(deepcopy=False)
                             if frozen.number not in owned and frozen.state != TrialState.WAITING]
        return optuna.Trial(self._ot_study, self._orphans.pop(0)) if self._orphans else None

    def restore(self, checkpoint_path: str) -> None:
        super().restore(checkpoint_path)
        self._orphans = None  # the study may hold trials asked after that checkpoint

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id not in self._completed_trials:
            self._report(self._ot_trials[trial_id], result)

    def _report(self, trial: optuna.Trial, result: dict) -> None:
        """The primary metric as an intermediate value at its training step (single objective)."""
        if isinstance(self.metric, list):
            self._record_evaluation(trial, result)
            return
        value, step = result.get(self.metric), result.get("step")
        if value is None or step is None or not math.isfinite(value):
            return
        frozen = _frozen(trial)
        if frozen.state == TrialState.RUNNING and int(step) not in frozen.intermediate_values:
            trial.report(float(value), int(step))

    def _record_evaluation(self, trial: optuna.Trial, result: dict) -> None:
        """Every objective at the result's step, in ``EVALS_ATTR`` (Optuna keeps no intermediate
        values for a multi-objective study; the dominance rungs read them back after a restart)."""
        values, step = [result.get(m) for m in self.metric], result.get("step")
        if step is None or None in values:
            return
        frozen = _frozen(trial)
        evals = frozen.user_attrs.get(EVALS_ATTR, {})
        if frozen.state == TrialState.RUNNING and str(int(step)) not in evals:
            trial.set_user_attr(EVALS_ATTR, {**evals, str(int(step)): [float(v) for v in values]})

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._completed_trials:
            return
        trial = self._ot_trials[trial_id]
        state, values, fate = self.outcome(result, error)
        self._report(trial, result or {})  # Tune passes the stopping result here, not to on_trial_result
        if _frozen(trial).state == TrialState.RUNNING:
            trial.set_user_attr(FATE_ATTR, fate)
            trial.set_user_attr("last_step", int((result or {}).get("step", 0)))
        try:
            self._ot_study.tell(trial, values, state=state, skip_if_finished=True)
        except ValueError as err:  # e.g. a NaN metric: record the trial as failed
            logger.warning("Optuna trial %d: %s; told as FAIL", trial.number, err)
            self._ot_study.tell(trial, None, state=TrialState.FAIL, skip_if_finished=True)
        self._completed_trials.add(trial_id)

    def outcome(self, result: dict | None, error: bool) -> tuple[TrialState, Any, str]:
        """(Optuna state, values, fate) of a finished trial from its last result."""
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        result = result or {}
        values = [result.get(m) for m in metrics]
        if error:
            return TrialState.FAIL, None, "failed"
        if int(result.get("step", 0)) < self.full_steps:
            if self.pruned_as == "complete" and None not in values:
                return TrialState.COMPLETE, _one(values), "pruned"
            return TrialState.PRUNED, None, "pruned"
        if None in values:
            return TrialState.FAIL, None, "failed"
        return TrialState.COMPLETE, _one(values), "completed"


class DefineByRun:
    """The space as Optuna define-by-run (a class, not a closure: Tune pickles the searcher)."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    def __call__(self, trial: optuna.Trial) -> dict[str, Any]:
        self.space.suggest(trial)  # recorded on the trial; Ray collects them from it
        return {TRIAL_KEY: trial.number}


def _frozen(trial: optuna.Trial) -> optuna.trial.FrozenTrial:
    return trial.study._storage.get_trial(trial._trial_id)  # one row; study.trials reads all


def _one(values: list[Any]) -> Any:
    return values[0] if len(values) == 1 else values
