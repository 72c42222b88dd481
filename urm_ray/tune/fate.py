"""What became of each trial, recorded on its nested MLflow run by the sweep's driver.

Ray Train V2 rejects Tune's ``MLflowLoggerCallback``, and a trial stopped by ASHA is killed
before it can say so itself, so this Tune callback (run in the driver) closes every trial's
run: ``completed`` (FINISHED), ``pruned`` (KILLED) or ``failed`` (FAILED, with the error), as
the tags ``urm_ray.fate``, ``urm_ray.fate_reason`` and ``urm_ray.fate_step``.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial

from urm_ray import tracking
from urm_ray.tracking import FATE_TAG, KIND_TAG, REASON_TAG, SWEEP_TAG, TRIAL_TAG
from urm_ray.tune.trial import STEP_TAG, TrialContext, split_config, trial_run_name

STATUS = {"completed": "FINISHED", "pruned": "KILLED", "failed": "FAILED"}
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
        run_id = tracking.find_run_id(ctx.tracking_uri, ctx.experiment, name)
        if run_id is None:  # failed before the driver opened its run: record it all the same
            tags = {tracking.PARENT_TAG: ctx.parent_run_id, SWEEP_TAG: ctx.sweep,
                    TRIAL_TAG: str(number), KIND_TAG: "trial"}
            params = {f"sampled.{k}": v for k, v in values.items()}
            run_id = tracking.open_run(ctx.tracking_uri, ctx.experiment, name, params, tags)
        elif FATE_TAG in tracking.run_summary(ctx.tracking_uri, run_id).tags:
            return  # recorded before an interruption; the replay does not change it
        tracking.set_tags(ctx.tracking_uri, run_id, {FATE_TAG: fate, REASON_TAG: reason,
                                                     STEP_TAG: str(step)})
        tracking.close_run(ctx.tracking_uri, run_id, STATUS[fate])
