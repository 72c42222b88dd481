"""A finished sweep extended with more trials, a warm start from it, and caps that stop a sweep
(slow: tiny sweeps on the private Ray instance and an SQLite MLflow store).

A 2-trial sweep is resumed with ``--trials 4``: the study, the nested MLflow runs and the
leaderboard then hold 4 trials, numbered 0-3 once each. A second sweep capped at a tiny
device-hour budget stops after its first trial, says so, and goes on when resumed with a
larger cap.
"""

from __future__ import annotations

import csv
import time

import pytest
import yaml
from mlflow.tracking import MlflowClient
from ray import tune

from urm_ray.cli import main
from urm_ray.errors import ConfigError
from urm_ray.tune.sweep import create_sweep, extend, load_sweep, run_sweep, set_caps

pytestmark = pytest.mark.slow

METRIC = "eval/token_accuracy"
SPACE = {
    "base": "sudoku4-urm",
    "overrides": {
        "model.hidden_size": 16, "model.num_heads": 2, "model.num_layers": 1, "model.expansion": 1.0,
        "model.max_segments": 2, "train.steps": 10, "train.global_batch_size": 8, "train.log_every": 5,
        "eval.every": 10, "checkpoint.every": 10, "eval.max_rows": 16,
        "resources.torch_threads": 1, "optim.warmup_steps": 1,
    },
    "params": {
        "model.loops": {"type": "int", "low": 2, "high": 3},
        "optim.lr": {"type": "log_float", "low": 1.0e-4, "high": 3.0e-3},
    },
    "objectives": [{"metric": METRIC, "mode": "max"}],
    "trials": 2,
    "concurrency": 1,
    "resources": {"workers": 1, "cpus_per_worker": 0.4},
    "scheduler": {"name": "none"},
    "search": {"seed": 0, "startup_trials": 1},
}


class TrialClock(tune.Callback):
    """Each trial's wall time as the driver sees it: Tune's start to Tune's completion."""

    def __init__(self) -> None:
        self.started: dict[int, float] = {}
        self.seconds: dict[int, float] = {}
        self.tune_total: dict[int, float] = {}

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.started[trial.config["trial_number"]] = time.monotonic()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        number = trial.config["trial_number"]
        self.seconds[number] = time.monotonic() - self.started[number]
        self.tune_total[number] = trial.last_result.get("time_total_s", 0.0)


@pytest.fixture(scope="module")
def extended(ray_local, sudoku_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweeps")
    data = sudoku_data(num_train=64, num_test=16, blanks=6)
    (root / "tiny.yaml").write_text(yaml.safe_dump(SPACE, sort_keys=False))
    uri = f"sqlite:///{root / 'mlflow.db'}"
    overrides = [f"data.path={data}", f"tracking.tracking_uri={uri}"]
    info, space = create_sweep(str(root / "tiny.yaml"), overrides, name="ext", root=str(root))
    set_caps(info, price=2.0)
    clock = TrialClock()
    actors_before = set(ray_local._private.state.actors())
    first = run_sweep(info, space, callbacks=[clock])
    started = [actor["ActorClassName"] for key, actor in ray_local._private.state.actors().items()
               if key not in actors_before]
    info, space = load_sweep("ext", str(root))
    with pytest.raises(ConfigError, match="--trials 1: sweep 'ext' has already started 2 trials"):
        extend(info, space, 1)
    space = extend(info, space, 4)
    second = run_sweep(info, space, resume=True)
    return {"root": root, "uri": uri, "data": data, "info": info, "first": first, "second": second,
            "clock": clock, "overrides": overrides, "started": started}


def _children(uri, info):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(info.experiment)
    return client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{info.parent_run_id}'")


def test_a_finished_sweep_extended_to_four_trials(extended):
    assert extended["first"].finished == 2 and not extended["first"].interrupted
    assert extended["second"].finished == 4 and extended["second"].requested == 4
    trials = extended["info"].study().trials
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert all(t.state.is_finished() for t in trials)
    names = sorted(r.info.run_name for r in _children(extended["uri"], extended["info"]))
    assert names == ["ext-t000", "ext-t001", "ext-t002", "ext-t003"]
    with (extended["root"] / "ext" / "leaderboard.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(int(r["trial"]) for r in rows) == [0, 1, 2, 3]
    assert all(float(r["device_hours"]) > 0 for r in rows)


def test_one_worker_trials_start_no_process_beside_their_trial_actor(extended):
    # Ray Train's report callback would start a queue actor per trial; one worker trains in the
    # trial actor (reused by the second trial) and reports to Tune directly
    assert extended["started"].count("ImplicitFunc") == 1, extended["started"]
    assert "_QueueActor" not in extended["started"], extended["started"]


def test_each_trial_and_the_sweep_record_their_cost(extended):
    runs = _children(extended["uri"], extended["info"])
    device = {int(r.data.tags["urm_ray.trial"]): r.data.metrics["cost/device_seconds"] for r in runs}
    assert all(r.data.metrics["cost/cpu_seconds"] > 0 for r in runs)
    # one worker: device-seconds are the trial's wall time, as Tune measured its trainable
    # (time_total_s, up to its last report). The first trial starts the actor, imports and loads:
    # the longest, where the closing of its run after the last report weighs least.
    tune_s = extended["clock"].tune_total
    assert 0.95 <= device[0] / tune_s[0] <= 1.05, (device, tune_s)
    assert all(device[n] >= 0.95 * tune_s[n] for n in tune_s), (device, tune_s)
    parent = MlflowClient(extended["uri"]).get_run(extended["info"].parent_run_id).data.metrics
    assert parent["cost/device_hours"] == pytest.approx(sum(device.values()) / 3600)
    assert parent["cost/usd"] == pytest.approx(parent["cost/device_hours"] * 2.0)


def test_warm_start_enqueues_the_best_trials_of_another_sweep(extended, tmp_path):
    root = str(extended["root"])
    info, space = create_sweep(str(extended["root"] / "tiny.yaml"), extended["overrides"], name="warm",
                               root=root, warm_start="ext:2")
    study = extended["info"].study()
    best = sorted((t for t in study.trials if t.values), key=lambda t: -t.values[0])[:2]
    assert space.spec.start_from == [dict(t.params) for t in best]
    narrow = {**SPACE, "params": {**SPACE["params"], "model.loops": {"type": "int", "low": 4, "high": 5}}}
    (tmp_path / "narrow.yaml").write_text(yaml.safe_dump(narrow))
    with pytest.raises(ConfigError, match=r"model.loops=\d is outside the searched range"):
        create_sweep(str(tmp_path / "narrow.yaml"), extended["overrides"], name="w2", root=root,
                     warm_start="ext")
    fewer = {**SPACE, "params": {"optim.lr": SPACE["params"]["optim.lr"]}}
    (tmp_path / "fewer.yaml").write_text(yaml.safe_dump(fewer))
    with pytest.raises(ConfigError, match=r"must set exactly the searched keys \['optim.lr'\]"):
        create_sweep(str(tmp_path / "fewer.yaml"), extended["overrides"], name="w3", root=root,
                     warm_start="ext")
    assert not (extended["root"] / "w2").exists() and not (extended["root"] / "w3").exists()


def test_a_device_hour_cap_stops_new_trials_and_a_larger_one_goes_on(extended, capsys):
    root = str(extended["root"])
    args = ["sweep", str(extended["root"] / "tiny.yaml"), "--name", "capped", "--dir", root,
            "--max-device-hours", "1e-9", *extended["overrides"]]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "stopped: --max-device-hours 1e-09 reached" in err
    info, _ = load_sweep("capped", root)
    assert info.max_device_hours == 1e-9
    assert len(info.study().trials) == 1
    assert main(["sweep", "--resume", "capped", "--dir", root, "--max-device-hours", "1"]) == 0
    info, _ = load_sweep("capped", root)
    assert info.max_device_hours == 1.0 and len(info.study().trials) == 2
    assert all(t.state.is_finished() for t in info.study().trials)
