"""A one-worker sweep trial trains in its Tune trial actor (``tune.trial_host.TrialHost``): its checkpoints go
through ``tune.report``; killed mid-run, Tune retries it (``retries``) from ``tune.get_checkpoint()``
and it ends with the weights of the same config trained without interruption, bit for bit, in one
MLflow run that logged every step once (slow)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient
from ray import tune

from urm_ray.config import build_config
from urm_ray.tracking import CHECKPOINT_TAG
from urm_ray.train import checkpoint
from urm_ray.train.driver import fit
from urm_ray.tune.sweep import create_sweep, run_sweep

pytestmark = pytest.mark.slow

KILL_AT = 20  # the trial actor is killed once it has reported this step (a checkpoint step)
SPACE = {
    "base": "sudoku4-urm",
    "overrides": {
        "model.hidden_size": 32, "model.num_heads": 2, "model.num_layers": 1, "model.expansion": 1.0,
        "train.steps": 60, "train.global_batch_size": 16, "train.log_every": 10, "eval.every": 10,
        "checkpoint.every": 10, "eval.max_rows": 16, "optim.warmup_steps": 2,
    },
    "params": {"optim.lr": {"type": "log_float", "low": 1.0e-4, "high": 3.0e-3}},
    "objectives": [{"metric": "eval/token_accuracy", "mode": "max"}],
    "start_from": [{"optim.lr": 1.0e-3}],
    "trials": 1,
    "retries": 1,
    "resources": {"workers": 1, "cpus_per_worker": 1},
    "scheduler": {"name": "none"},
}


class KillActorOnce(tune.Callback):
    """SIGKILLs the trial's actor process (the pid in its result) once it has reported ``KILL_AT``."""

    def __init__(self) -> None:
        self.killed: list[int] = []

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if not self.killed and result.get("step", 0) >= KILL_AT:
            self.killed.append(result["step"])
            os.kill(result["pid"], signal.SIGKILL)


def test_a_killed_trial_actor_is_retried_from_its_checkpoint_bit_for_bit(ray_local, sudoku_data, tmp_path: Path):
    data = sudoku_data(num_train=300, num_test=32, blanks=8)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE, sort_keys=False))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    info, space = create_sweep(str(tmp_path / "space.yaml"), [f"data.path={data}", f"tracking.tracking_uri={uri}"],
                               name="killed", root=str(tmp_path / "sweeps"))
    killer = KillActorOnce()
    outcome = run_sweep(info, space, callbacks=[killer])
    assert killer.killed and outcome.finished == 1

    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name(info.experiment).experiment_id],
                               f"tags.`mlflow.parentRunId` = '{info.parent_run_id}'")
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/lm_loss")]
    assert steps == list(range(10, 61, 10))  # every step once: the retry replayed none twice
    trained = Path(run.data.tags[CHECKPOINT_TAG])
    assert trained.is_relative_to(info.path / "tune")  # a checkpoint Tune persisted
    state = checkpoint.load_state(trained)
    assert state["position"]["step"] == 60

    # the same config, trained without interruption in this process
    saved = checkpoint.load_config_dict(trained)
    saved["train"]["run_name"] = "straight"
    saved["checkpoint"]["storage_path"] = str(tmp_path / "runs")
    saved["tracking"]["enabled"] = False
    straight = fit(build_config(saved))
    for name, value in checkpoint.load_state(Path(straight.checkpoint_path))["model"].items():
        assert torch.equal(state["model"][name], value), name
