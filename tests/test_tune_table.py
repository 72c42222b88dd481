"""The sweep's live table and the progress line above it, on real Tune trial objects."""

from __future__ import annotations

from io import StringIO

from ray.tune.experiment import Trial

from urm_ray.tune.search import TRIAL_KEY
from urm_ray.tune.table import TrialTable


def _trials(n: int) -> list[Trial]:
    return [Trial("trial_fn", config={TRIAL_KEY: i, "model.loops": 2 + i}, stub=True) for i in range(n)]


def test_the_summary_counts_finished_trials_and_names_the_best():
    trials = _trials(3)
    for trial in trials[:2]:
        trial.set_status(Trial.RUNNING)
    table = TrialTable("eval/exact_accuracy", "max", 100, requested=8, out=StringIO())
    assert table.summary(trials) == "sweep: 0/8 trials finished, 2 running"
    table.on_trial_result(0, trials, trials[0], {"eval/exact_accuracy": 0.5, "step": 50})
    table.on_trial_result(0, trials, trials[1], {"eval/exact_accuracy": 0.7, "step": 100})
    table.fates[trials[1].trial_id] = "completed"
    assert table.summary(trials) == "sweep: 1/8 trials finished, 1 running; best eval/exact_accuracy 0.7 (t001)"


def test_min_mode_picks_the_lowest():
    trials = _trials(2)
    table = TrialTable("eval/loss", "min", 100, requested=2, out=StringIO())
    table.on_trial_result(0, trials, trials[0], {"eval/loss": 0.2})
    table.on_trial_result(0, trials, trials[1], {"eval/loss": 0.9})
    assert table.summary(trials).endswith("best eval/loss 0.2 (t000)")


def test_draw_prints_the_summary_above_the_table():
    out = StringIO()
    table = TrialTable("eval/exact_accuracy", "max", 100, requested=4, out=out)
    table.draw(_trials(2))
    lines = out.getvalue().splitlines()
    assert lines[0] == "sweep: 0/4 trials finished, 0 running"
    assert lines[1].split() == ["trial", "state", "step", "eval/exact_accuracy", "best", "loops"]
    assert [line.split()[:2] for line in lines[2:]] == [["t000", "pending"], ["t001", "pending"]]
