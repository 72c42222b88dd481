"""Resuming a run (``train.resume``): what a resume may change, and one driver per run.

- a resume with ``model.hidden_size`` changed is refused before training, naming the key with
  both values, and leaves the checkpoints, their config.yaml and the MLflow run as they were; with
  ``train.steps`` raised instead it continues in the same MLflow run, which records the new value
  as a tag (its param keeps the first one), and the new checkpoint's config.yaml has it;
- a run another process holds (its lock, its fresh heartbeat on the RUNNING MLflow run) is
  refused, naming where it runs; a heartbeat alone, from another host, is refused too;
- on S3 the checkpoint's config.yaml is read there: the newest complete checkpoint's;
- a RUNNING run whose heartbeat is stale, or whose recorded driver is gone from this host,
  resumes; so does a sweep's trial after a failure, whatever its heartbeat says.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from urm_ray import heartbeat, tracking
from urm_ray.config import load_config
from urm_ray.errors import ConfigError
from urm_ray.runs import list_runs
from urm_ray.tracking import DRIVER_TAG, HEARTBEAT_TAG, KIND_TAG
from urm_ray.train import checkpoint, resume
from urm_ray.train.driver import fit
from urm_ray.tune.trial_host import in_sweep

from tiny import run_config
from test_cloud import BUCKET, FAKE_AWS, s3  # noqa: F401 (the moto S3 server fixture)

def _config(tmp_path: Path, data: Path, *overrides: str):
    return run_config(data, tmp_path, "resume", "train.log_every=2", "checkpoint.every=2",
                      "train.steps=2", "train.run_name=r", *overrides)


def _uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_resume_may_raise_the_step_count_but_not_change_the_model(ray_local, tmp_path: Path, sudoku4: Path):
    first = fit(_config(tmp_path, sudoku4))
    before = _files(tmp_path / "runs" / "r")
    client = MlflowClient(_uri(tmp_path))
    run = client.get_run(first.mlflow_run_id)
    with pytest.raises(ConfigError) as refused:
        fit(_config(tmp_path, sudoku4, "model.hidden_size=32", "train.steps=4"))
    message = str(refused.value)
    assert "train.run_name=r resumes from " in message and first.checkpoint_path in message
    assert "model.hidden_size: saved 16, now 32" in message
    assert "train.steps" not in message.split("differs in ")[1].split(". ")[0]  # allowed to change
    assert "another train.run_name, or pass the saved values: model.hidden_size=16" in message
    assert _files(tmp_path / "runs" / "r") == before  # checkpoints and their config.yaml
    after = client.get_run(first.mlflow_run_id)
    assert after.info.status == "FINISHED" and after.info.end_time == run.info.end_time
    assert after.data.tags == run.data.tags  # not reopened

    resumed = fit(_config(tmp_path, sudoku4, "train.steps=4"))
    assert resumed.metrics["step"] == 4 and resumed.mlflow_run_id == first.mlflow_run_id
    saved = checkpoint.load_config_dict(Path(resumed.checkpoint_path))
    assert saved["train"]["steps"] == 4 and saved["model"]["hidden_size"] == 16
    run = client.get_run(first.mlflow_run_id)
    assert run.data.params["train.steps"] == "2"  # immutable: the first start's
    assert run.data.tags["urm_ray.resumed.train.steps"] == "4"
    assert not [t for t in run.data.tags if t.startswith("urm_ray.resumed.model.")]
    assert list_runs(_uri(tmp_path), "resume").splitlines()[1].split()[4] == "4/4"


def _running(tmp_path: Path, beat_age_s: float, driver: str) -> str:
    """The MLflow run ``r`` as a driver left it: RUNNING, beating ``beat_age_s`` ago."""
    run_id = tracking.open_run(_uri(tmp_path), "resume", "r", {})
    tracking.Run(_uri(tmp_path), run_id).set_tags({HEARTBEAT_TAG: f"{time.time() - beat_age_s:.0f}",
                                               DRIVER_TAG: driver})
    return run_id


def _holding_lock(folder: Path) -> subprocess.Popen:
    """Another process holding the run's lock, as a driver does, until its stdin closes."""
    folder.mkdir(parents=True, exist_ok=True)
    code = ("import fcntl, os, socket, sys\n"
            f"fd = os.open({str(folder / resume.LOCK_FILE)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, f'{socket.gethostname()}:{os.getpid()}'.encode())\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_run_training_elsewhere_is_refused(ray_local, tmp_path: Path, sudoku4: Path):
    import socket

    other = _holding_lock(tmp_path / "runs" / "r")
    try:
        run_id = _running(tmp_path, 10, f"{socket.gethostname()}:{other.pid}")
        with pytest.raises(ConfigError) as refused:
            fit(_config(tmp_path, sudoku4))
    finally:
        other.stdin.close()
        other.wait(timeout=30)
    message = str(refused.value)
    assert f"train.run_name=r is training now on {socket.gethostname()}, pid {other.pid}" in message
    assert f"(it holds {tmp_path / 'runs' / 'r' / resume.LOCK_FILE})" in message  # refused by the lock
    assert "heartbeat" not in message.split(":")[0]  # the lock's holder is a live process here
    assert "Wait for it to end, or start another train.run_name" in message
    assert MlflowClient(_uri(tmp_path)).get_run(run_id).info.status == "RUNNING"
    # the lock released (its holder ended), a fresh beat from another host still refuses
    tracking.Run(_uri(tmp_path), run_id).set_tags({DRIVER_TAG: "elsewhere:123"})
    with pytest.raises(ConfigError, match="training now on elsewhere, pid 123"):
        fit(_config(tmp_path, sudoku4))


def test_a_lost_driver_does_not_hold_its_run(ray_local, tmp_path: Path, sudoku4: Path):
    """A stale heartbeat (another host's driver): the run trains on, in the same MLflow run. A
    fresh one whose driver process on this host is gone does not hold it either."""
    import socket

    run_id = _running(tmp_path, 2 * 300 + 60, "elsewhere:123")
    result = fit(_config(tmp_path, sudoku4))
    assert result.mlflow_run_id == run_id and result.metrics["step"] == 2
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    _running(tmp_path, 5, f"{socket.gethostname()}:{gone.stdout.strip()}")
    cfg = _config(tmp_path, sudoku4)
    with resume.locked(cfg):
        heartbeat.check_reopen(tracking.find_summary(_uri(tmp_path), "resume", "r"), in_sweep=False)
        assert (tmp_path / "runs" / "r" / resume.LOCK_FILE).read_text().strip() == heartbeat.this_driver()


def test_a_sweep_trial_restarts_whatever_its_heartbeat(ray_local, tmp_path: Path, sudoku4: Path):
    """Tune restores a failed trial at once: its run's heartbeat from the failed attempt is fresh.
    (Outside Tune here: the trial's reports are kept out of it.)"""
    run_id = _running(tmp_path, 5, "elsewhere:123")
    result = fit(_config(tmp_path, sudoku4), tags={KIND_TAG: "trial"},
                 sweep=in_sweep(lambda metrics, with_checkpoint: None))
    assert result.mlflow_run_id == run_id and result.metrics["step"] == 2


def test_on_s3_the_newest_complete_checkpoint_decides(s3, monkeypatch):
    """The newest checkpoint on S3 lacks its state.pt (a write under way): the one before decides."""
    import pyarrow.fs

    from urm_ray.config import dump_yaml

    for name, value in {**FAKE_AWS, "AWS_ENDPOINT_URL": s3}.items():
        monkeypatch.setenv(name, value)
    storage = f"s3://{BUCKET}/resume"
    cfg = load_config("sudoku4-urm", [f"checkpoint.storage_path={storage}", "train.run_name=r"])
    resume.check(cfg)  # no checkpoint: a new run
    fs, root = pyarrow.fs.FileSystem.from_uri(storage)
    for stamp, text in (("2026-01-01_00-00-00.000001", dump_yaml(cfg)), ("2026-01-02_00-00-00.000001", "{}")):
        with fs.open_output_stream(f"{root}/r/checkpoint_{stamp}/config.yaml") as out:
            out.write(text.encode())
    with fs.open_output_stream(f"{root}/r/checkpoint_2026-01-01_00-00-00.000001/state.pt") as out:
        out.write(b"state")
    resume.check(cfg)
    with pytest.raises(ConfigError, match=f"resumes from {storage}/r/checkpoint_2026-01-01_00-00-00.000001, "
                                          "whose config differs in model.loops: saved 4, now 3; optim.lr: "
                                          "saved 0.001, now 0.5. A resume"):
        resume.check(load_config("sudoku4-urm", [f"checkpoint.storage_path={storage}", "train.run_name=r",
                                                 "model.loops=3", "optim.lr=0.5"]))
