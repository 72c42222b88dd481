"""The sweep's ASHA (no Ray cluster): it decides as Tune's ``ASHAScheduler`` does on the same
stream of results, and after a restart it judges against the rungs the study already holds,
where Tune's scheduler starts empty and lets a weak trial go on."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import optuna
import pytest
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from urm_ray.tune.rungs import StudyASHA, milestones
from urm_ray.tune.search import TRIAL_KEY

METRIC = "eval/exact_accuracy"


def _trial(number: int) -> SimpleNamespace:
    return SimpleNamespace(trial_id=f"id{number}", config={TRIAL_KEY: number})


def _result(step: int, value: float) -> dict:
    return {"step": step, METRIC: value}


def _ours(tmp_path: Path, mode: str = "max", name: str = "s") -> StudyASHA:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    optuna.create_study(storage=url, study_name=name, load_if_exists=True)
    return StudyASHA(METRIC, mode, max_t=50, grace=10, rf=2.0, storage_url=url, study_name=name)


def test_rungs_lie_below_the_last_step():
    assert milestones(10, 50, 2.0) == [10, 20, 40]
    assert milestones(250, 2250, 3.0) == [250, 750]  # a trial at max_t completes, it is not pruned
    assert milestones(10, 11, 2.0) == [10]


@pytest.mark.parametrize("mode", ["max", "min"])
def test_same_decisions_as_tunes_asha_on_one_loop(tmp_path, mode):
    """Twelve trials reporting every 10 steps in an interleaved order with random values."""
    rng = np.random.default_rng(0)
    ours = _ours(tmp_path, mode)
    tunes = ASHAScheduler(time_attr="step", metric=METRIC, mode=mode, max_t=50, grace_period=10,
                          reduction_factor=2.0, stop_last_trials=False)
    trials = [_trial(n) for n in range(12)]
    for trial in trials:
        tunes.on_trial_add(None, trial)
    alive, decisions = set(range(12)), []
    for step in range(10, 51, 10):
        for n in rng.permutation(12):
            if n not in alive:
                continue
            result = _result(step, float(rng.normal()))
            a, b = ours.on_trial_result(None, trials[n], result), tunes.on_trial_result(None, trials[n], result)
            assert a == b, (n, step, result)
            decisions.append(a)
            if a == TrialScheduler.STOP:
                alive.discard(n)
    assert decisions.count(TrialScheduler.STOP) >= 4  # the comparison covered stops, not only go-ons


def test_after_a_restart_a_weak_trial_is_judged_against_the_study(tmp_path):
    """Trials 0-2 reached step 20 before the restart; trial 3, weaker at step 10, reports first
    after it. Tune's fresh scheduler has nothing to compare with; ours stops it."""
    ours = _ours(tmp_path)
    study = optuna.load_study(study_name="s", storage=ours.storage_url)
    for value in (0.5, 0.6, 0.7):
        trial = study.ask()
        trial.report(value, 10)
        trial.report(value + 0.1, 20)
    tunes = ASHAScheduler(time_attr="step", metric=METRIC, mode="max", max_t=50, grace_period=10,
                          reduction_factor=2.0, stop_last_trials=False)
    weak = _trial(3)
    tunes.on_trial_add(None, weak)
    assert tunes.on_trial_result(None, weak, _result(10, 0.55)) == TrialScheduler.CONTINUE
    assert ours.on_trial_result(None, weak, _result(10, 0.55)) == TrialScheduler.STOP
    assert ours.cutoff(10) == pytest.approx(0.575)  # the median of 0.5, 0.6, 0.7, 0.55


def test_a_resumed_trial_is_not_judged_again_at_a_rung_it_passed(tmp_path):
    """Trial 0 passed rung 10 alone, then the loop restarted; it re-reports step 10 from its
    checkpoint after stronger trials have reached the rung, and goes on."""
    ours = _ours(tmp_path)
    study = optuna.load_study(study_name="s", storage=ours.storage_url)
    study.ask().report(0.1, 10)
    for number, value in ((1, 0.8), (2, 0.9)):
        assert ours.on_trial_result(None, _trial(number), _result(10, value)) == TrialScheduler.CONTINUE
    assert ours.on_trial_result(None, _trial(0), _result(10, 0.1)) == TrialScheduler.CONTINUE
    assert ours.on_trial_result(None, _trial(0), _result(20, 0.2)) == TrialScheduler.CONTINUE
    assert ours.on_trial_result(None, _trial(1), _result(20, 0.1)) == TrialScheduler.STOP


def test_reports_before_the_first_evaluation_are_let_through_without_reading_the_study(tmp_path):
    ours = _ours(tmp_path)
    assert ours.on_trial_result(None, _trial(0), {"step": 5}) == TrialScheduler.CONTINUE
    assert not ours.seeded
    ours.on_trial_complete(None, _trial(0), _result(10, 0.3))  # a stopping result counts too
    assert ours.seeded and ours.rungs[10] == {0: 0.3}


@pytest.mark.parametrize("mode", ["max", "min"])
def test_a_nan_value_counts_as_the_worst_and_stays_out_of_the_cutoff(tmp_path, mode):
    """NaN: a derived objective that could not be computed for the trial."""
    ours = _ours(tmp_path, mode)
    nan = float("nan")
    assert ours.on_trial_result(None, _trial(0), _result(10, nan)) == TrialScheduler.CONTINUE  # alone
    assert ours.cutoff(10) is None
    assert ours.on_trial_result(None, _trial(1), _result(10, 0.5)) == TrialScheduler.CONTINUE
    assert ours.on_trial_result(None, _trial(2), _result(10, nan)) == TrialScheduler.STOP
    assert ours.cutoff(10) == pytest.approx(0.5 if mode == "max" else -0.5)  # the NaNs left out
