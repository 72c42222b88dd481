"""What `urm-ray final` shows of its re-check stage, on real Tune trial objects (the whole command
runs in test_tune_sweep.py)."""

from __future__ import annotations

import logging

from ray.tune.experiment import Trial

from urm_ray.tune.final_view import RecheckProgress, run_label


def _grid() -> tuple[dict[str, str], list[Trial]]:
    """Two configs (sweep trials 5 and 1) x two seeds, as ``best.reevaluate`` names them."""
    labels = {f"t{n}-s{s}": run_label(rank, 2, n, s + 1) for rank, n in ((1, 5), (2, 1)) for s in range(2)}
    return labels, [Trial("seed_run", config={"run": run}, stub=True) for run in labels]


def test_labels_name_the_config_rank_its_trial_and_the_seed():
    assert run_label(2, 3, 5, 1) == "2/3 t005 seed 1"


def test_plain_lines_name_the_runs_going_and_the_last_result(caplog):
    caplog.set_level(logging.INFO, logger="urm_ray.progress")
    labels, trials = _grid()
    view = RecheckProgress(labels, "eval/exact_accuracy")
    view.on_trial_start(0, trials, trials[0])
    view.on_trial_start(0, trials, trials[1])
    trials[0].run_metadata.last_result = {"eval/exact_accuracy": 0.9125}
    view.on_trial_complete(0, trials, trials[0])
    view.on_trial_start(0, trials, trials[2])
    view.on_trial_error(0, trials, trials[1])
    view.on_experiment_end(trials)
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" (")[0] for line in lines] == ["final re-check: 0/4 runs"] * 2 + [
        "final re-check: 1/4 runs"] * 2 + ["final re-check: 2/4 runs"]
    assert lines[1].endswith("running 1/2 t005 seed 1, 1/2 t005 seed 2")
    assert lines[2].endswith("running 1/2 t005 seed 2  last 1/2 t005 seed 1 = 0.9125")
    assert lines[4].endswith("running 2/2 t001 seed 1  last 1/2 t005 seed 2 failed")


def test_on_a_terminal_a_bar(capsys):
    labels, trials = _grid()
    view = RecheckProgress(labels, "eval/exact_accuracy", live=True)
    view.on_trial_start(0, trials, trials[3])
    view.on_experiment_end(trials)
    err = capsys.readouterr().err
    assert "final re-check: " in err and "0/4" in err and "running=2/2 t001 seed 2" in err
