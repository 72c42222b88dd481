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
    assert table.summary(trials) == ("sweep: 1/8 trials finished (1 completed), 1 running; "
                                     "best eval/exact_accuracy 0.7 (t001)")


def test_min_mode_picks_the_lowest():
    trials = _trials(2)
    table = TrialTable("eval/loss", "min", 100, requested=2, out=StringIO())
    table.on_trial_result(0, trials, trials[0], {"eval/loss": 0.2})
    table.on_trial_result(0, trials, trials[1], {"eval/loss": 0.9})
    assert table.summary(trials).endswith("best eval/loss 0.2 (t000)")


def test_draw_prints_the_summary_above_the_table():
    out = StringIO()
    table = TrialTable("eval/exact_accuracy", "max", 100, requested=4, out=out)
    trials = _trials(2)
    trials[1].set_status(Trial.RUNNING)
    table.on_trial_result(0, trials, trials[0], {"eval/exact_accuracy": 0.5, "step": 50})
    table.draw(trials)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("sweep: 0/4 trials finished, 1 running")
    assert lines[1].split() == ["trial", "state", "step", "eval/exact_accuracy", "best", "loops"]
    assert [line.split()[:2] for line in lines[2:]] == [["t000", "pending"], ["t001", "running"]]


def test_a_thousand_trials_show_the_top_the_running_and_a_count():
    trials = _trials(1000)
    table = TrialTable("eval/exact_accuracy", "max", 100, requested=1000, out=StringIO())
    for i, trial in enumerate(trials[:990]):
        table.on_trial_result(0, trials, trial, {"eval/exact_accuracy": i / 1000, "step": 100})
        table.fates[trial.trial_id] = "pruned" if i % 3 else "completed"
    for trial in trials[990:995]:
        trial.set_status(Trial.RUNNING)
    lines = table.table(trials).splitlines()
    shown = [line.split()[0] for line in lines[1:-1]]
    assert shown == [f"t{i:03d}" for i in range(980, 995)]  # the 10 best, then the 5 running
    assert lines[-1] == "... 985 more (urm-ray runs lists every trial)"
    assert table.summary(trials).startswith("sweep: 990/1000 trials finished (330 completed, 660 pruned), 5 running")


def test_a_log_gets_one_row_per_finished_trial_not_the_whole_table():
    out = StringIO()
    trials = _trials(50)
    table = TrialTable("eval/exact_accuracy", "max", 100, requested=50, out=out)
    for trial in trials:
        trial.set_status(Trial.TERMINATED)
        trial.update_last_result({"eval/exact_accuracy": 0.5, "step": 100})
        table.on_trial_result(0, trials, trial, trial.last_result)
        table.on_trial_complete(0, trials, trial)
    assert len(out.getvalue().splitlines()) == 50 * 3  # progress line, header, the trial's row
