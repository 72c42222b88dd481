"""A single-worker run in the command's own process (``resources.in_process``, ``hosts.ProcessHost``).

- ``auto`` picks it only where nothing else changes: one worker, no restarts, no custom worker
  resources, local storage, the private Ray instance this process started; ``true`` where it
  cannot work is refused, naming the key;
- the loop writes its checkpoints into the run's folder: a run interrupted at step 4 and resumed
  in-process ends with the weights of an uninterrupted 8-step run, bit for bit, in the same MLflow
  run, keeping ``checkpoint.keep``; and a run begun in-process resumes on Ray Train's
  worker path (``in_process=false``) to the same weights (slow).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from urm_ray import cluster
from urm_ray.errors import ConfigError
from urm_ray.train import checkpoint
from urm_ray.train.driver import fit
from urm_ray.train.session import runs_in_process

from tiny import run_config

def _config(tmp_path: Path, data: Path, *overrides: str):
    return run_config(data, tmp_path, "local", "train.log_every=2", "checkpoint.every=2", *overrides)


def test_auto_runs_in_process_only_where_nothing_else_changes(ray_local, tmp_path: Path, sudoku4: Path,
                                                              monkeypatch):
    assert runs_in_process(_config(tmp_path, sudoku4))
    for other in (["resources.num_workers=2"], ["resources.max_failures=1"], ["resources.worker_resources={slot: 1}"],
                  ["checkpoint.storage_path=s3://bucket/runs"], ["resources.in_process=false"]):
        assert not runs_in_process(_config(tmp_path, sudoku4, *other)), other
    monkeypatch.setattr(cluster, "_private_gcs", "127.0.0.1:1")  # a cluster this process joined
    assert not runs_in_process(_config(tmp_path, sudoku4))
    assert runs_in_process(_config(tmp_path, sudoku4, "resources.in_process=true"))


def test_in_process_true_where_it_cannot_work_is_refused(tmp_path: Path, sudoku4: Path):
    with pytest.raises(ConfigError, match="resources.in_process=true.*num_workers=1 \\(got 2\\)"):
        _config(tmp_path, sudoku4, "resources.in_process=true", "resources.num_workers=2")
    with pytest.raises(ConfigError, match="local checkpoint.storage_path \\(got 's3://bucket/runs'\\)"):
        _config(tmp_path, sudoku4, "resources.in_process=true", "checkpoint.storage_path=s3://bucket/runs")


def _weights(path: str) -> dict[str, torch.Tensor]:
    return checkpoint.load_state(Path(path))["model"]


@pytest.mark.slow
def test_an_in_process_run_resumes_exactly_on_either_path(ray_local, tmp_path: Path, sudoku4: Path):
    straight = fit(_config(tmp_path, sudoku4, "train.steps=8", "train.run_name=straight"))
    first = fit(_config(tmp_path, sudoku4, "train.steps=4", "train.run_name=cut"))
    assert first.checkpoint_path and Path(first.checkpoint_path).parent == tmp_path / "runs" / "cut"
    resumed = fit(_config(tmp_path, sudoku4, "train.steps=8", "train.run_name=cut"))
    assert resumed.metrics["step"] == 8 and resumed.mlflow_run_id == first.mlflow_run_id
    for name, value in _weights(straight.checkpoint_path).items():
        assert torch.equal(_weights(resumed.checkpoint_path)[name], value), name
    # checkpoints at steps 2, 4, 6, 8: the newest checkpoint.keep (2) stay, complete
    kept = checkpoint.saved_local(tmp_path / "runs" / "cut")
    assert [checkpoint.load_state(p)["position"]["step"] for p in kept] == [6, 8]
    assert not list((tmp_path / "runs" / "cut").glob(".partial-*"))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    history = client.get_metric_history(resumed.mlflow_run_id, "train/lm_loss")
    assert sorted(m.step for m in history) == [2, 4, 6, 8]  # nothing logged twice or skipped
    assert client.get_run(resumed.mlflow_run_id).info.status == "FINISHED"

    # begun in this process, resumed by a Ray Train worker actor from the same folder
    fit(_config(tmp_path, sudoku4, "train.steps=4", "train.run_name=moved"))
    moved = fit(_config(tmp_path, sudoku4, "train.steps=8", "train.run_name=moved", "resources.in_process=false"))
    assert moved.metrics["step"] == 8
    for name, value in _weights(straight.checkpoint_path).items():
        assert torch.equal(_weights(moved.checkpoint_path)[name], value), name
