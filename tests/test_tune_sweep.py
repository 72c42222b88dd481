"""A tiny sweep end to end on the private 2-CPU Ray instance and an SQLite MLflow store (slow).

One sweep of 3 trials (2 at a time) meets a fault of the cluster that ends Tune's loop (it goes
on by itself from Tune's saved state), then is interrupted with SIGINT (Ctrl-C) after its first finished
trial and resumed: it must end with exactly 3 trials in Optuna and 3 nested MLflow runs, at least
one of them pruned by ASHA (PRUNED in Optuna, KILLED with its fate in MLflow), and a parent run
holding the best config, the leaderboard and the plots; ``best`` exports a config that
``urm-ray train`` accepts, and ``final`` re-runs it over seeds, trains it and registers the model.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
from pathlib import Path

import pytest
import ray
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from ray import tune

from urm_ray.cli import main
from urm_ray.config import load_config
from urm_ray.tune.best import FinalRequest, final
from urm_ray.tune.sweep import create_sweep, load_sweep, run_sweep

pytestmark = pytest.mark.slow

METRIC = "eval/token_accuracy"  # finer than exact accuracy after a few steps: fewer ties
SPACE = {
    "base": "sudoku4-urm",
    "overrides": {
        "model.hidden_size": 32, "model.num_heads": 2, "model.num_layers": 1,
        "model.expansion": 1.0, "train.steps": 30, "train.global_batch_size": 16,
        "train.log_every": 5, "eval.every": 10, "checkpoint.every": 10,
        "eval.max_rows": 32, "optim.warmup_steps": 2,
    },
    "params": {
        "model.loops": {"type": "int", "low": 2, "high": 3},
        "model.truncation": {"type": "int", "low": 0, "high": "model.loops - 1"},
        "optim.lr": {"type": "log_float", "low": 1.0e-4, "high": 3.0e-3},
    },
    "objectives": [{"metric": METRIC, "mode": "max"}],
    # two good configs first, then a hopeless lr: it starts after both have passed the first
    # ASHA rung and falls below them there, so at least one trial is pruned
    "start_from": [
        {"model.loops": 2, "model.truncation": 1, "optim.lr": 3.0e-3},
        {"model.loops": 2, "model.truncation": 0, "optim.lr": 2.0e-3},
        {"model.loops": 2, "model.truncation": 1, "optim.lr": 1.0e-4},
    ],
    "trials": 3,
    "resources": {"workers": 1, "cpus_per_worker": 0.4},
    "scheduler": {"name": "asha", "grace_steps": 10, "reduction_factor": 2},
    "search": {"seed": 0, "startup_trials": 2},
    "final": {"top": 1, "seeds": 2, "overrides": {"train.steps": 20}},
}


class InterruptOnce(tune.Callback):
    """Ctrl-C after the first finished trial, once (the callback is restored on resume)."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        if not self.flag.exists():
            self.flag.touch()
            os.kill(os.getpid(), signal.SIGINT)


class FaultOnce(tune.Callback):
    """Once, at a trial's result after its first checkpoint, fail Tune's loop the way its actor
    manager does on an actor task killed by Ray's memory monitor."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if result.get("step", 0) >= 10 and not self.flag.exists():
            self.flag.touch()
            killed = ray.exceptions.OutOfMemoryError("1 worker(s) were killed due to the node running low on memory.")
            raise RuntimeError(f"Caught unexpected exception: {killed}") from killed


@pytest.fixture(scope="module")
def sweep(ray_local, sudoku_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweeps")
    data = sudoku_data(num_train=300, num_test=64, blanks=8)
    (root / "tiny.yaml").write_text(yaml.safe_dump(SPACE, sort_keys=False))
    uri = f"sqlite:///{root / 'mlflow.db'}"
    info, space = create_sweep(str(root / "tiny.yaml"), [f"data.path={data}", f"tracking.tracking_uri={uri}"],
                               name="tiny", root=str(root))
    faulted = io.StringIO()
    with contextlib.redirect_stdout(faulted):
        first = run_sweep(info, space, callbacks=[FaultOnce(root / "faulted"), InterruptOnce(root / "interrupted")])
    stopped = {"runs": _children({"uri": uri, "info": info}),
               "trials": info.study().trials}  # as Ctrl-C left them, before the resume
    info, space = load_sweep("tiny", str(root))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        second = run_sweep(info, space, resume=True)
    return {"root": root, "uri": uri, "info": info, "space": space, "first": first, "second": second,
            "printed": printed.getvalue(), "faulted": faulted.getvalue(), "stopped": stopped}


def _children(sweep) -> list:
    client = MlflowClient(sweep["uri"])
    experiment = client.get_experiment_by_name(sweep["info"].experiment)
    parent = sweep["info"].parent_run_id
    return client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")


def test_a_sweep_prints_its_own_table_not_tunes_banner(sweep):
    assert "trials finished" in sweep["printed"]
    for tune_line in ("Configuration for experiment", "View detailed results", "tensorboard"):
        assert tune_line not in sweep["printed"], sweep["printed"][-2000:]


def test_a_fault_of_the_cluster_does_not_end_the_sweep(sweep):
    assert (sweep["root"] / "faulted").exists()
    assert "Tune stopped on a fault of the cluster (OutOfMemoryError" in sweep["faulted"], sweep["faulted"][-2000:]
    assert (sweep["root"] / "interrupted").exists()  # the restarted loop ran on to the Ctrl-C


def test_interrupted_sweep_resumes_to_exactly_the_requested_trials(sweep):
    assert sweep["first"].interrupted and sweep["first"].finished < 3
    assert sweep["second"].finished == 3 and not sweep["second"].interrupted
    trials = sweep["info"].study().trials
    assert [t.number for t in trials] == [0, 1, 2]
    assert all(t.state.is_finished() for t in trials)
    children = _children(sweep)
    names = sorted(r.info.run_name for r in children)
    assert names == ["tiny-t000", "tiny-t001", "tiny-t002"]  # no duplicate runs


def test_ctrl_c_leaves_no_trial_running_and_the_resume_trains_them_on(sweep):
    """Which trials were still training when Ctrl-C came depends on timing (both may just have
    finished); whatever it was, none is left RUNNING, and those cut are trained on by the resume
    (test_tune_fate.py checks each case on a hand-made store)."""
    runs = sweep["stopped"]["runs"]
    assert runs and all(r.info.status != "RUNNING" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    cut = [r for r in runs if r.data.tags.get("urm_ray.fate") == "interrupted"]
    assert all(r.info.status == "KILLED" for r in cut)
    assert all("urm-ray sweep --resume tiny" in r.data.tags["urm_ray.fate_reason"] for r in cut)
    open_trials = [t for t in sweep["stopped"]["trials"] if t.state == TrialState.RUNNING]
    assert all(t.user_attrs.get("fate") == "interrupted" for t in open_trials)
    resumed = {r.info.run_name: r for r in _children(sweep)}
    for run in cut:  # the resume trained them on and recorded their own fate
        after = resumed[run.info.run_name]
        assert after.data.tags["urm_ray.fate"] in ("completed", "pruned"), after.data.tags
        assert after.info.status in ("FINISHED", "KILLED")


def test_trials_are_pruned_and_recorded_with_their_fate(sweep):
    trials = sweep["info"].study().trials
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    # a failed trial's MLflow run says why (urm_ray.fate_reason)
    assert pruned, ([(t.number, t.state, t.intermediate_values) for t in trials],
                    [(r.info.run_name, r.data.tags.get("urm_ray.fate_reason")) for r in _children(sweep)])
    assert all(t.intermediate_values and t.user_attrs["fate"] == "pruned" for t in pruned)
    fates = {r.info.run_name: (r.data.tags["urm_ray.fate"], r.info.status) for r in _children(sweep)}
    for trial in trials:
        fate = trial.user_attrs["fate"]
        expected = {"completed": "FINISHED", "pruned": "KILLED", "failed": "FAILED"}[fate]
        assert fates[f"tiny-t{trial.number:03d}"] == (fate, expected)


def test_trial_runs_hold_sampled_values_full_config_and_curves(sweep):
    client = MlflowClient(sweep["uri"])
    for run in _children(sweep):
        params = run.data.params
        assert {"sampled.model.loops", "sampled.optim.lr", "model.loops", "train.steps",
                "data.path"} <= set(params)
        assert params["sampled.model.loops"] == params["model.loops"]
        history = client.get_metric_history(run.info.run_id, METRIC)
        assert history and history[0].step == 10, (run.info.run_name, run.data.tags)


def test_parent_run_holds_best_config_leaderboard_and_plots(sweep):
    client = MlflowClient(sweep["uri"])
    parent = client.get_run(sweep["info"].parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics[f"best/{METRIC}"] == sweep["second"].best_value
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"best_config.yaml", "leaderboard.csv", "plots"} <= artifacts
    plots = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"plots/optimization_history.png", "plots/slice.png"} <= plots
    rows = (sweep["info"].path / "leaderboard.csv").read_text().splitlines()
    assert len(rows) == 4 and rows[0].startswith("rank,trial,fate,last_step")


def test_best_config_is_exported_and_trainable(sweep, capsys):
    out = sweep["root"] / "best.yaml"
    assert main(["best", "tiny", "--dir", str(sweep["root"]), "--out", str(out)]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == yaml.safe_load(out.read_text())
    cfg = load_config(str(out))
    best = max((t for t in sweep["info"].study().trials if t.state == TrialState.COMPLETE),
               key=lambda t: t.value)
    assert cfg.optim.lr == best.params["optim.lr"] and cfg.model.loops == best.params["model.loops"]
    assert cfg.train.steps == 30
    # the trials ran on 0.4 CPU with resources.device=cpu; the exported config keeps the base's
    base = load_config("sudoku4-urm").resources
    assert (cfg.resources.cpus_per_worker, cfg.resources.device) == (base.cpus_per_worker, base.device)


def test_final_reruns_seeds_trains_and_registers(sweep, caplog):
    caplog.set_level(logging.INFO)
    outcome = final("tiny", str(sweep["root"]), FinalRequest(seeds=2, overrides=("train.log_every=5",)))
    assert len(outcome.scores[outcome.winner]) == 2
    assert outcome.metrics["step"] == 20 and outcome.model_version == "1"
    # what it showed: the stages, each re-check run starting and ending, the winner's training
    messages = [r.getMessage() for r in caplog.records]
    winner = f"t{outcome.winner:03d}"
    stages = ("final stage 1/2: re-checking the top 1 config(s)", "final re-check: 2/2 runs",
              f"final stage 2/2: training the winner {winner}", "training from step 0",
              f"final {winner}: 20/20 steps", "uploading the checkpoint", "final: registering its model")
    at = [next((i for i, m in enumerate(messages) if m.startswith(stage)), -1) for stage in stages]
    assert -1 not in at and at == sorted(at), (dict(zip(stages, at)), messages)
    rechecks = [m for m in messages if m.startswith("final re-check: ")]
    assert len(rechecks) == 4 and f"last 1/1 {winner} seed" in rechecks[-1]  # 2 starts, 2 ends
    client = MlflowClient(sweep["uri"])
    run = client.get_run(outcome.run_id)
    base = load_config("sudoku4-urm").resources  # the final run's resources: not the trials' 0.4 CPU
    assert run.data.params["resources.cpus_per_worker"] == str(base.cpus_per_worker)
    final_parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    assert final_parent.data.tags["mlflow.parentRunId"] == sweep["info"].parent_run_id
    version = client.get_model_version(outcome.model_name, "1")
    assert version.run_id == outcome.run_id and METRIC in version.tags
