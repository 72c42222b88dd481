"""End-to-end training on a real local Ray cluster with a real MLflow store (slow).

- a short single-worker run of `urm-ray train` on 4x4 Sudoku learns far above chance on
  held-out puzzles, showing its setup and progress and no traceback; `urm-ray runs` lists it;
- its MLflow run holds the flattened config, the curves, the config/checkpoint artifacts and the
  dataset input, and the checkpoint evaluates offline to the same score;
- checkpointing and resuming a run of 2 DDP (gloo) workers (same MLflow run, right step) is
  tested with S3 storage and an MLflow server in ``test_cloud.py``;
- the arc-tiny preset, at tiny sizes for a few steps, logs arc/pass_at_2 by voting;
- bad configs (missing dataset, unplaceable workers) fail before any work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from urm_ray.config import load_config
from urm_ray.data.tasks import sudoku
from urm_ray.errors import ConfigError, DataError
from urm_ray.train.driver import fit
from urm_ray.train.session import check_storage
from urm_ray.eval.config import EvalConfig
from urm_ray.evaluate import evaluate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sudoku4(sudoku_data) -> Path:
    """A larger dataset than the shared one: these runs train long enough to learn."""
    return sudoku_data(num_train=600, num_test=100, blanks=8)


def _config(tmp_path: Path, data: Path, *overrides: str):
    return load_config("sudoku4-urm", [
        f"data.path={data}", f"checkpoint.storage_path={tmp_path / 'runs'}",
        f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "tracking.experiment=test",
        *overrides,
    ])


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`urm-ray ARGS` in its own process, as a user runs it: no RAY_ADDRESS, so it starts its own
    Ray instance (next to the test run's own and any other on the machine)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    return subprocess.run([sys.executable, "-m", "urm_ray.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_run_learns_and_is_recorded_in_mlflow(ray_local, tmp_path: Path, sudoku4: Path, capsys):
    """`urm-ray train`: setup phases, a progress line per report, then the last phases in order
    (evaluation, checkpoint, teardown, upload), no traceback, nothing from Ray; the run learns,
    MLflow records it, `urm-ray runs` lists it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = _cli(tmp_path, "train", "sudoku4-urm", f"data.path={sudoku4}", f"tracking.tracking_uri={uri}",
                "tracking.experiment=test", "checkpoint.storage_path=runs", "train.steps=300",
                "train.log_every=20", "eval.every=150", "checkpoint.every=0",
                "train.run_name=learn", "optim.warmup_steps=100", "train.global_batch_size=64")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)  # stdout holds the summary alone: Ray's output stays in its logs
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    phases = ("reading data", "starting Ray (a private local instance)", "building the model (urm)",
              "training from step 0", "evaluating at step 150", "evaluating at step 300",
              "saving the checkpoint at step 300", "stopping the workers", "uploading the checkpoint")
    at = [done.stderr.find(phase) for phase in phases]
    assert -1 not in at and at == sorted(at), (dict(zip(phases, at)), done.stderr)  # in this order
    lines = [line.split("urm_ray.progress: ")[1] for line in done.stderr.splitlines()
             if "urm_ray.progress: train: " in line]
    reports = sorted({*range(20, 301, 20), 150})  # log_every and eval_every
    assert [line.split(" (")[0] for line in lines] == [f"train: {s}/300 steps" for s in reports]
    assert "eval_exact -" in lines[0] and "eval_exact -" not in lines[-1] and "samples/s" in lines[-1]

    # Chance: a model that copies the 8 givens and guesses the 8 blanks among 4 digits scores
    # 8/16 + 8/16 * 1/4 = 0.625 token accuracy; learning must beat it clearly.
    assert summary["eval/token_accuracy"] > 0.675, summary
    assert summary["eval/rows"] == 100
    assert f"eval_exact {summary['eval/exact_accuracy']:.3f}" in lines[-1]

    client = MlflowClient(uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["model.loops"] == "4"
    assert run.data.params["train.global_batch_size"] == "64"
    assert run.data.params["data.path"] == str(sudoku4)
    assert {"train/lm_loss", "train/exact_accuracy", "train/lr", "train/samples_per_s", "train/act_segments",
            "eval/exact_accuracy", "eval/token_accuracy", "eval/mean_segments"} <= set(run.data.metrics)
    assert "train/steps" not in run.data.metrics  # the mean ACT segments, named as such
    assert 1 <= run.data.metrics["train/act_segments"] <= 4  # model.max_segments
    experiment = client.get_experiment(run.info.experiment_id)  # MLflow's UI: a training experiment
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert summary["mlflow_ui"].endswith(f"/runs/{run.info.run_id}?workflowType=machine_learning")
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/exact_accuracy")] == [150, 300]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "checkpoint"} <= artifacts
    assert [i.dataset.name for i in run.inputs.dataset_inputs] == ["sudoku4"]
    saved = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoint")}
    assert {"checkpoint/state.pt", "checkpoint/config.yaml"} <= saved

    offline = evaluate(summary["checkpoint"], EvalConfig()).metrics
    assert offline["eval/exact_accuracy"] == pytest.approx(summary["eval/exact_accuracy"])

    from urm_ray.cli import main

    assert main(["runs", "--tracking-uri", uri]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["experiment", "run", "kind", "state", "step", "best",
                              "eval/exact_accuracy", "checkpoint"]
    best = max(m.value for m in client.get_metric_history(run.info.run_id, "eval/exact_accuracy"))
    assert row.split() == ["test", "learn", "train", "FINISHED", "300/300", f"{best:.4f}",
                           summary["checkpoint"]]


def test_missing_dataset_fails_before_work(tmp_path: Path):
    with pytest.raises(DataError, match="metadata.json"):
        fit(_config(tmp_path, tmp_path / "nowhere"))


def test_unwritable_storage_fails_before_ray(tmp_path: Path, sudoku4: Path):
    import ray

    was_up = ray.is_initialized()
    with pytest.raises(ConfigError, match="checkpoint.storage_path='/proc/nope/runs': checkpoints cannot be written"):
        fit(_config(tmp_path, sudoku4, "checkpoint.storage_path=/proc/nope/runs"))
    assert ray.is_initialized() == was_up  # refused before Ray was started
    fit_dir = tmp_path / "fresh" / "runs"
    check_storage(str(fit_dir))  # a missing local folder is created, and the probe removed
    assert fit_dir.is_dir() and not list(fit_dir.iterdir())


@pytest.mark.parametrize("preset, asks", [("sudoku4-gram-urm", ("model.prior_match=1", "model.prior_match_targets=nearest")),
                                           ("sudoku4-urm", ("train.label_targets=nearest",))])
def test_a_search_the_task_lacks_fails_before_ray(tmp_path: Path, preset: str, asks: tuple[str, ...]):
    import ray

    out = tmp_path / "sudoku6"
    sudoku.build_generated(out, size=6, num_train=20, num_test=4, blanks=8, seed=1)
    was_up = ray.is_initialized()
    with pytest.raises(ConfigError, match=r"sudoku: a nearest-board search .* \(got 6x6\)"):
        fit(load_config(preset, [f"data.path={out}", f"checkpoint.storage_path={tmp_path / 'runs'}", *asks]))
    assert ray.is_initialized() == was_up and not (tmp_path / "runs").exists()


def test_unplaceable_workers_fail_at_once(ray_local, tmp_path: Path, sudoku4: Path):
    with pytest.raises(ConfigError, match="resources.num_workers=4"):
        fit(_config(tmp_path, sudoku4, "resources.num_workers=4", "train.global_batch_size=128"))


def test_a_diverging_run_fails_with_its_reason_and_no_checkpoint(ray_local, tmp_path: Path, sudoku4: Path,
                                                                  capsys):
    """optim.lr=1e6: the loss turns inf/nan within a few steps. The command exits non-zero with one
    line naming the step, the MLflow run is FAILED with that reason, and no checkpoint exists."""
    from urm_ray.cli import main

    overrides = [f"data.path={sudoku4}", f"checkpoint.storage_path={tmp_path / 'runs'}",
                 f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "tracking.experiment=test",
                 "optim.lr=1e6", "optim.warmup_steps=0", "train.steps=40", "train.log_every=10",
                 "eval.every=20", "checkpoint.every=20", "train.run_name=nan"]
    assert main(["train", "sudoku4-urm", *overrides]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("urm-ray: training failed: non-finite loss at step "), error
    step = int(error.split("at step ")[1].split(":")[0])
    assert 1 <= step <= 10  # stopped at the first report, before any evaluation or checkpoint
    run = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs(
        [MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_experiment_by_name("test").experiment_id])[0]
    assert run.info.status == "FAILED"
    assert run.data.tags["urm_ray.fate"] == "failed"
    assert run.data.tags["urm_ray.fate_reason"].startswith(f"non-finite loss at step {step}")
    assert "eval/exact_accuracy" not in run.data.metrics
    assert not list((tmp_path / "runs").rglob("checkpoint_*"))
    # logged when the run opened: a failed run still shows its config and dataset
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert "config.yaml" in {a.path for a in client.list_artifacts(run.info.run_id)}
    assert [i.dataset.name for i in client.get_run(run.info.run_id).inputs.dataset_inputs] == ["sudoku4"]


def test_arc_tiny_trains_and_logs_pass_at_2(ray_local, tmp_path: Path, capsys):
    """The arc-tiny preset on its README recipe (first evaluation tasks, their test pairs held out),
    at tiny sizes for a few steps: the run votes over augmented views and MLflow has pass@2."""
    from urm_ray.cli import main

    arc_dir = Path(__file__).resolve().parent / "fixtures" / "arc-agi"
    assert main(["data", "arc", "--source", str(arc_dir), "--out", str(tmp_path / "arc"),
                 "--subsets", "evaluation", "--test-set", "evaluation", "--tasks", "3"]) == 0
    assert "3 tasks" in capsys.readouterr().out
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["train", "arc-tiny", f"data.path={tmp_path / 'arc'}", "data.num_augmentations=2",
                 "model.hidden_size=16", "model.num_heads=2", "model.num_layers=1",
                 "model.max_segments=2", "model.puzzle_emb_dim=16", "train.steps=4",
                 "train.global_batch_size=4", "train.log_every=2", "eval.views=true", "eval.width=2",
                 "eval.batch_size=8", f"checkpoint.storage_path={tmp_path / 'runs'}",
                 f"tracking.tracking_uri={uri}", "tracking.experiment=test"]) == 0
    summary = json.loads(capsys.readouterr().out)
    metrics = MlflowClient(uri).get_run(summary["mlflow_run_id"]).data.metrics
    assert 0.0 <= metrics["arc/pass_at_2"] <= 1.0 and metrics["arc/pass_at_1"] <= metrics["arc/pass_at_2"]
    assert metrics["arc/tasks"] == 3 and metrics["arc/predictions"] == 2 * metrics["arc/test_pairs"]
    assert "eval/exact_accuracy" in metrics


def test_ctrl_c_closes_the_run_killed(tmp_path: Path, sudoku4: Path):
    """SIGINT to `urm-ray train` once it trains: the MLflow run ends KILLED, not RUNNING or FAILED,
    and the command's last words say how to resume from the checkpoint it has (no traceback
    under them); it exits 130."""
    import signal
    import time

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "urm_ray.cli", "train", "sudoku4-urm", f"data.path={sudoku4}",
           f"checkpoint.storage_path={tmp_path / 'runs'}", f"tracking.tracking_uri={uri}",
           "tracking.experiment=test", "train.steps=100000", "train.log_every=10",
           "checkpoint.every=10", "train.run_name=stop"]
    log = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen(cmd, env={**os.environ, "RAY_ADDRESS": "local"}, stdout=subprocess.DEVNULL,
                            stderr=log, text=True)
    client, deadline = MlflowClient(uri), time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            runs = _runs(client)
            if runs and list((tmp_path / "runs" / "stop").glob("checkpoint_*")):
                break  # a checkpoint is on disk (its upload can lag the metrics on a loaded machine)
            time.sleep(2)
        assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _runs(client)[0].info.status == "KILLED"
    assert "rerun with train.run_name=stop to resume there" in (tmp_path / "stderr.txt").read_text()


def _runs(client: MlflowClient) -> list:
    experiment = client.get_experiment_by_name("test")
    return client.search_runs([experiment.experiment_id]) if experiment else []
