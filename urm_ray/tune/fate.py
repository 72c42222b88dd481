"""What became of each trial, recorded on its nested MLflow run by the sweep's driver.

Ray Train V2 rejects Tune's ``MLflowLoggerCallback``, and a trial stopped by ASHA is killed
before it can say so itself, so this Tune callback (run in the driver) closes every trial's
run: ``completed`` (FINISHED), ``pruned`` (KILLED) or ``failed`` (FAILED, with the error), as
the tags ``urm_ray.fate``, ``urm_ray.fate_reason`` and ``urm_ray.fate_step``.

A sweep stopped by Ctrl-C leaves its running trials ``interrupted`` (``record_interrupted``):
their runs KILLED, their Optuna trials RUNNING (Optuna has no state a resume could continue
from) with the user attribute ``fate: interrupted``, until ``--resume`` trains them on.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState
from ray.tune import Callback
from ray.tune.experiment import Trial

from urm_ray import tracking
from urm_ray.tracking import FATE_TAG, KIND_TAG, REASON_TAG, SWEEP_TAG, TRIAL_TAG
from urm_ray.tune.search import FATE_ATTR
from urm_ray.tune.trial import INTERRUPTED, STEP_TAG, TrialContext, split_config, trial_run_name

STATUS = {"completed": "FINISHED", "pruned": "KILLED", "failed": "FAILED", INTERRUPTED: "KILLED"}
_REASON_CHARS = 1000


def trial_fate(trial: Trial, full_steps: int) -> str:
    if trial.status == Trial.ERROR:
        return "failed"
    return "completed" if int(trial.last_result.get("step", 0)) >= full_steps else "pruned"


class FateRecorder(Callback):
    """Tags and closes each trial's MLflow run when Tune finishes the trial."""

    def __init__(self, ctx: TrialContext, scheduler: str) -> None:
        self.ctx = ctx
        self.scheduler = scheduler

    def __getstate__(self) -> dict[str, Any]:
        # Tune saves its callbacks to the sweep folder (and reads them back on --resume)
        return {**self.__dict__, "ctx": self.ctx.without_secrets()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.ctx = self.ctx.with_secrets()

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        step = int(trial.last_result.get("step", 0))
        if step >= self.ctx.space.steps:
            self._record(trial, "completed", f"trained all {step} steps", step)
            return
        metric = self.ctx.space.metric
        value = trial.last_result.get(metric)
        shown = f"{metric}={value:.4f}" if isinstance(value, float) else f"{metric} not reported yet"
        self._record(trial, "pruned", f"stopped by {self.scheduler} at step {step} ({shown})", step)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        error = trial.get_error()
        lines = [line for line in str(error).splitlines() if line.strip()] if error else []
        reason = lines[-1] if lines else "unknown error"
        self._record(trial, "failed", reason[:_REASON_CHARS], int(trial.last_result.get("step", 0)))

    def _record(self, trial: Trial, fate: str, reason: str, step: int) -> None:
        ctx = self.ctx
        number, values = split_config(trial.config)
        name = trial_run_name(ctx.sweep, number)
        run = tracking.Run.find(ctx.tracking_uri, ctx.experiment, name)
        if run is None:  # failed before the driver opened its run: record it all the same
            tags = {tracking.PARENT_TAG: ctx.parent_run_id, SWEEP_TAG: ctx.sweep,
                    TRIAL_TAG: str(number), KIND_TAG: "trial"}
            params = {f"sampled.{k}": v for k, v in values.items()}
            run = tracking.Run.open(ctx.tracking_uri, ctx.experiment, name, params, tags)
        elif run.tags().get(FATE_TAG, INTERRUPTED) != INTERRUPTED:
            return  # recorded before an interruption; the replay does not change it
        run.set_tags({FATE_TAG: fate, REASON_TAG: reason, STEP_TAG: str(step)})
        run.close(STATUS[fate])


def record_interrupted(ctx: TrialContext, study: optuna.Study, resume_hint: str) -> None:
    """After a sweep stopped early: its trial runs left open, or closed FAILED by a driver Ray
    stopped, with no fate of their own, become KILLED with fate ``interrupted``; its RUNNING
    Optuna trials get ``fate: interrupted``."""
    for run in tracking.child_runs(ctx.tracking_uri, ctx.experiment, ctx.parent_run_id):
        if FATE_TAG in run.tags or run.status not in ("RUNNING", "FAILED"):
            continue
        handle = tracking.Run(ctx.tracking_uri, run.run_id)
        handle.set_tags({FATE_TAG: INTERRUPTED, REASON_TAG: f"the sweep was interrupted; {resume_hint}"})
        handle.close(STATUS[INTERRUPTED])
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        optuna.Trial(study, frozen._trial_id).set_user_attr(FATE_ATTR, INTERRUPTED)
