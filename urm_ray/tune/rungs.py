"""ASHA whose rungs outlive Tune's loop: asynchronous successive halving, seeded from the study.

Tune does not save its scheduler's state: after ``--resume`` or a restart on a fault of the
cluster, its ``ASHAScheduler`` starts with empty rungs, so the first trials to reach each rung
go on whatever they score, and a weak trial that happens to report first is never stopped. The
evaluations every trial reached are in the Optuna study already (intermediate values at their
training steps), so this scheduler reads them once, at the first result it sees after Tune's
loop (re)starts, and fills its rungs from them.

The rule is Tune's ASHA with one bracket: rungs at ``grace * rf**k`` steps below ``max_t`` (a
trial at ``max_t`` has trained all its steps: it completes, it is not pruned at its last one);
a trial's first evaluation at or past a rung is recorded there, and it stops if that value is
below the ``1 - 1/rf`` quantile of the values recorded at the rung. A trial recorded at a rung
is not judged there again (its earlier decision stands: a resumed trial re-reports the steps
after its checkpoint). A NaN value counts as the worst: it stops where the rung has a cutoff, and
is left out of the cutoff. Trials are known by their Optuna trial number, the identity that survives
a restart, not by Tune's trial id.

With several objectives (``StudyDominance``) the rungs are the same but the rule is Pareto
dominance: a trial stops at a rung only if a trial recorded there is at least as good on every
objective and better on one, so a trial on the rung's own front (the most accurate, the cheapest,
or any trade-off between them) always goes on; one with a NaN objective stops where the rung
holds another trial. Optuna keeps no intermediate values for a
multi-objective study; the searcher records each evaluation's objective values in the trial's
``EVALS_ATTR`` user attribute instead, and a restart reads the rungs back from there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import optuna
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from urm_ray.tune.info import storage
from urm_ray.tune.pareto import dominates, signed
from urm_ray.tune.search import EVALS_ATTR, TRIAL_KEY


def milestones(grace: int, max_t: int, rf: float) -> list[int]:
    """The rung steps, lowest first: ``grace * rf**k`` below ``max_t``."""
    steps, k = [], 0
    while round(grace * rf**k) < max_t:
        steps.append(round(grace * rf**k))
        k += 1
    return steps


class StudyASHA(FIFOScheduler):
    """ASHA over the ``step`` of each result, its rungs read back from the study (see module)."""

    def __init__(self, metric: str, mode: str, max_t: int, grace: int, rf: float,
                 storage_url: str, study_name: str) -> None:
        super().__init__()
        self._metric, self._mode = metric, mode
        self.sign = 1.0 if mode == "max" else -1.0  # rung values: higher is better
        self.rf = rf
        self.rungs: dict[int, dict[int, float]] = {m: {} for m in milestones(grace, max_t, rf)}
        self.storage_url, self.study_name = storage_url, study_name
        self.seeded = False  # pickled with Tune's state before any result: a restore reads again

    def seed(self, histories: Iterable[tuple[int, Mapping[int, float]]]) -> None:
        """Record each trial's first value at or past every rung it reached."""
        for number, values in histories:
            steps = sorted(values)
            for milestone, recorded in self.rungs.items():
                reached = [s for s in steps if s >= milestone]
                if reached and number not in recorded:
                    recorded[number] = self.sign * float(values[reached[0]])

    def _seed_from_study(self) -> None:
        study = optuna.load_study(study_name=self.study_name, storage=storage(self.storage_url))
        self.seed((t.number, t.intermediate_values) for t in study.get_trials(deepcopy=False)
                  if t.intermediate_values)
        self.seeded = True

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        return self._judge(trial, result)

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        self._judge(trial, result or {})  # a trial's stopping result comes here, not to on_trial_result

    def _judge(self, trial, result: dict) -> str:
        if "step" not in result or self._metric not in result or TRIAL_KEY not in trial.config:
            return TrialScheduler.CONTINUE  # reports before the first evaluation
        if not self.seeded:
            self._seed_from_study()
        return self.decide(int(trial.config[TRIAL_KEY]), int(result["step"]), float(result[self._metric]))

    def decide(self, number: int, step: int, value: float) -> str:
        """CONTINUE or STOP for trial ``number`` evaluated at ``step``, recording the value."""
        for milestone in sorted(self.rungs, reverse=True):
            recorded = self.rungs[milestone]
            if step < milestone:
                continue
            if number in recorded:
                return TrialScheduler.CONTINUE  # judged at this rung (or a higher one) before
            cutoff = self.cutoff(milestone)
            recorded[number] = self.sign * value
            # NaN (a derived metric that could not be computed) ranks below every value
            if cutoff is not None and (math.isnan(value) or self.sign * value < cutoff):
                return TrialScheduler.STOP
            return TrialScheduler.CONTINUE
        return TrialScheduler.CONTINUE

    def cutoff(self, milestone: int) -> float | None:
        values = [v for v in self.rungs[milestone].values() if not math.isnan(v)]
        return float(np.percentile(values, (1 - 1 / self.rf) * 100)) if values else None

    def debug_string(self) -> str:
        return "ASHA rungs: " + " | ".join(f"step {m}: {len(r)} trials, cutoff {self.cutoff(m)}"
                                           for m, r in sorted(self.rungs.items()))


class StudyDominance(StudyASHA):
    """The rungs of ``StudyASHA`` over several objectives, with the dominance rule (see module)."""

    def __init__(self, metrics: list[str], modes: list[str], max_t: int, grace: int, rf: float,
                 storage_url: str, study_name: str) -> None:
        super().__init__(metrics[0], modes[0], max_t, grace, rf, storage_url, study_name)
        self.metrics = list(metrics)
        self.signs = [1.0 if m == "max" else -1.0 for m in modes]
        self.points: dict[int, dict[int, tuple[float, ...]]] = {m: {} for m in self.rungs}

    def _seed_from_study(self) -> None:
        study = optuna.load_study(study_name=self.study_name, storage=storage(self.storage_url))
        for trial in study.get_trials(deepcopy=False):
            evals = trial.user_attrs.get(EVALS_ATTR, {})
            steps = sorted(int(s) for s in evals)
            for milestone, recorded in self.points.items():
                reached = [s for s in steps if s >= milestone]
                if reached and trial.number not in recorded:
                    recorded[trial.number] = signed(evals[str(reached[0])], self.signs)
        self.seeded = True

    def _judge(self, trial, result: dict) -> str:
        if "step" not in result or TRIAL_KEY not in trial.config or any(m not in result for m in self.metrics):
            return TrialScheduler.CONTINUE
        if not self.seeded:
            self._seed_from_study()
        values = [float(result[m]) for m in self.metrics]
        return self.decide(int(trial.config[TRIAL_KEY]), int(result["step"]), values)

    def decide(self, number: int, step: int, value: Sequence[float]) -> str:  # type: ignore[override]
        """CONTINUE or STOP for trial ``number`` evaluated at ``step`` with these objective values."""
        point = signed(value, self.signs)
        for milestone in sorted(self.points, reverse=True):
            recorded = self.points[milestone]
            if step < milestone:
                continue
            if number in recorded:
                return TrialScheduler.CONTINUE
            # a NaN objective fails the trial at the end (Optuna takes no NaN): it stops as in ASHA
            dominated = any(dominates(other, point) for other in recorded.values()) or (
                bool(recorded) and any(math.isnan(v) for v in value))
            recorded[number] = point
            return TrialScheduler.STOP if dominated else TrialScheduler.CONTINUE
        return TrialScheduler.CONTINUE

    def debug_string(self) -> str:
        return "dominance rungs: " + " | ".join(f"step {m}: {len(r)} trials"
                                                for m, r in sorted(self.points.items()))
