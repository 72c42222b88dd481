"""What Ctrl-C leaves of a sweep's trials (no Ray): on a real SQLite MLflow store and Optuna study,
``record_interrupted`` closes exactly the trial runs that were still training, and a resumed
trial clears that fate before it trains on."""

from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from urm_ray import tracking
from urm_ray.tracking import FATE_TAG, KIND_TAG, PARENT_TAG, REASON_TAG
from urm_ray.tune.fate import record_interrupted
from urm_ray.tune.space import load_space
from urm_ray.tune.trial import TrialContext, _replay_finished


@pytest.fixture
def sweep(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = tracking.open_run(uri, "sweep-s", "s", {}, {KIND_TAG: "sweep"})
    ctx = TrialContext("s", load_space("quickstart"), {}, uri, "sweep-s", parent)
    runs = {}
    for name, status, fate in [("s-t000", "FINISHED", "completed"), ("s-t001", "KILLED", "pruned"),
                               ("s-t002", "RUNNING", None), ("s-t003", "FAILED", None),
                               ("s-t004", "FINISHED", None)]:
        run_id = tracking.open_run(uri, "sweep-s", name, {}, {PARENT_TAG: parent, KIND_TAG: "trial"})
        if fate:
            tracking.Run(uri, run_id).set_tags({FATE_TAG: fate})
        if status != "RUNNING":
            tracking.Run(uri, run_id).close(status)
        runs[name] = run_id
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}", study_name="s")
    study.tell(study.ask(), 0.5)
    study.ask()  # still RUNNING
    return ctx, runs, study


def test_only_the_trials_still_training_are_killed_as_interrupted(sweep):
    ctx, runs, study = sweep
    record_interrupted(ctx, study, "resume with `urm-ray sweep --resume s`")
    client = MlflowClient(ctx.tracking_uri)
    got = {name: (client.get_run(run_id).info.status, client.get_run(run_id).data.tags.get(FATE_TAG))
           for name, run_id in runs.items()}
    assert got == {"s-t000": ("FINISHED", "completed"), "s-t001": ("KILLED", "pruned"),
                   "s-t002": ("KILLED", "interrupted"), "s-t003": ("KILLED", "interrupted"),
                   "s-t004": ("FINISHED", None)}  # trained to the end: the resume replays it
    reason = client.get_run(runs["s-t002"]).data.tags[REASON_TAG]
    assert reason == "the sweep was interrupted; resume with `urm-ray sweep --resume s`"
    trials = study.get_trials()
    assert trials[0].user_attrs == {} and trials[1].user_attrs == {"fate": "interrupted"}
    assert trials[1].state == optuna.trial.TrialState.RUNNING  # the resume continues it


def test_a_resumed_interrupted_trial_trains_on_without_the_fate(sweep):
    ctx, runs, study = sweep
    record_interrupted(ctx, study, "resume with `urm-ray sweep --resume s`")
    assert _replay_finished(ctx, "s-t002", {}) is False  # trains, rather than replaying a result
    tags = MlflowClient(ctx.tracking_uri).get_run(runs["s-t002"]).data.tags
    assert FATE_TAG not in tags and REASON_TAG not in tags
