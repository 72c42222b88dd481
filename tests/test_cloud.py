"""Cloud storage end to end, against local stand-ins: a moto S3 server and a real MLflow server (slow).

What a cluster does, on one machine: ``mlflow server`` keeps runs in SQLite and artifacts in an
S3 bucket (``--artifacts-destination s3://...``, reached through ``MLFLOW_S3_ENDPOINT_URL``);
``urm-ray train`` finds the server through ``MLFLOW_TRACKING_URI`` and writes its Ray Train
checkpoints to ``checkpoint.storage_path=s3://...`` (custom endpoint from ``AWS_ENDPOINT_URL``).
The runs join one Ray head, as on a cluster whose nodes hold the bucket's endpoint and
credentials in their environment. A 4-step run of 2 DDP workers checkpoints to S3; the same run
name with 8 steps resumes there at step 4, logs into the same MLflow run and ends with the same
weights, bit for bit, as an 8-step run never interrupted; artifacts and checkpoints are read back
from the bucket with boto3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest
import yaml
from mlflow.tracking import MlflowClient

from test_cluster import free_port, stop_group, subprocess_env
from tiny import RUN

pytestmark = pytest.mark.slow

BUCKET = "urm-ray-test"
FAKE_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1"}
BIN = Path(sys.executable).parent
TINY_RUN = [*RUN, "resources.num_workers=2", "resources.cpus_per_worker=0.5", "train.global_batch_size=16",
            "train.log_every=2", "checkpoint.every=4", "eval.max_rows=17",
            "tracking.experiment=cloud", "train.run_name=s3-resume"]


class Server:
    """A server in its own process group (``mlflow server`` forks workers): stop kills the group."""

    def __init__(self, cmd: list[str], url: str, log: Path, env: dict[str, str]) -> None:
        start = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.startup_s = self._wait(url, log, start)

    def _wait(self, url: str, log: Path, start: float, timeout: float = 120) -> float:
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{url} exited: {log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(url, timeout=2)
                return time.monotonic() - start
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"{url} not up after {timeout} s: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        stop_group(self.proc, timeout=15)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server with an empty bucket; yields its endpoint URL."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = Server([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                    f"{endpoint}/moto-api/", log, {**os.environ, **FAKE_AWS})
    try:
        client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


def client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


@pytest.fixture(scope="module")
def mlflow_server(s3, tmp_path_factory):
    """``mlflow server``: SQLite backend, artifacts proxied to s3://BUCKET/mlflow on moto."""
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    cmd = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
           "--artifacts-destination", f"s3://{BUCKET}/mlflow", "--workers", "1"]
    env = {**os.environ, **FAKE_AWS, "MLFLOW_S3_ENDPOINT_URL": s3,
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = Server(cmd, f"http://127.0.0.1:{port}/health", folder / "server.log", env)
    print(f"mlflow server up in {server.startup_s:.1f} s")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def head(s3):
    """A Ray head of 4 CPUs with its State API (Ray Train's placement-group cleaner asks it),
    every Ray process of it with the S3 endpoint and credentials in its environment; yields the
    environment a run joins it with."""
    from ray.cluster_utils import Cluster

    dashboard = free_port()
    env = {**FAKE_AWS, "AWS_ENDPOINT_URL": s3, "PYTHONPATH": subprocess_env()["PYTHONPATH"],
           "RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{dashboard}"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)  # the head's processes inherit it
        nodes = Cluster(initialize_head=True, connect=False, head_node_args={
            "num_cpus": 4, "include_dashboard": True, "dashboard_port": dashboard})
        try:
            yield subprocess_env(**env, RAY_ADDRESS=nodes.address)
        finally:
            nodes.shutdown()


def start_train(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """``urm-ray train`` in a subprocess in its own process group (``stop_group`` stops it)."""
    cmd = [sys.executable, "-m", "urm_ray.cli", "train", "sudoku4-urm", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def summary(proc: subprocess.Popen, timeout: float = 420) -> dict:
    """Wait for a run started by ``start_train``; its JSON summary."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    return json.loads(out[out.rfind("\n{\n") + 1:])  # the summary is last


@pytest.fixture(scope="module")
def runs(head, mlflow_server, sudoku_data):
    """4 steps with a checkpoint, then the same run name to 8 steps: both on S3 and the server;
    and the same 8 steps under another name, uninterrupted."""
    data = sudoku_data(num_test=17)
    # No tracking.tracking_uri: the run must find the server through MLFLOW_TRACKING_URI.
    env = {**head, "MLFLOW_TRACKING_URI": mlflow_server}
    common = [*TINY_RUN, f"data.path={data}", f"checkpoint.storage_path=s3://{BUCKET}/runs"]
    start = time.monotonic()
    # the uninterrupted run shares nothing with the first: both train at once
    straight_run = start_train([*common, "train.steps=8", "train.run_name=s3-straight"], env)
    try:
        first = summary(start_train([*common, "train.steps=4"], env))
        middle = time.monotonic()
        second = summary(start_train([*common, "train.steps=8"], env))
        straight = summary(straight_run)
    finally:
        stop_group(straight_run)  # nothing left once it has ended; else a failed fixture leaves no run
    print(f"S3 runs: first {middle - start:.0f} s, resumed {time.monotonic() - middle:.0f} s")
    return first, second, straight


def test_checkpoints_on_s3_and_resume_there(runs, s3):
    first, second, _ = runs
    assert first["step"] == 4 and second["step"] == 8
    # 17 held-out rows over 2 workers: every row scored once (an equal split would drop one)
    assert first["eval/rows"] == second["eval/rows"] == 17
    assert first["checkpoint"].startswith(f"s3://{BUCKET}/runs/s3-resume/checkpoint_")
    assert second["checkpoint"].startswith(f"s3://{BUCKET}/runs/s3-resume/checkpoint_")
    keys = [o["Key"] for o in client(s3).list_objects_v2(Bucket=BUCKET, Prefix="runs/s3-resume/")["Contents"]]
    assert sum(k.endswith("/state.pt") for k in keys) == 2, keys  # steps 4 and 8 (keep 2)
    assert second["mlflow_run_id"] == first["mlflow_run_id"], "resume must log into the same run"


def test_mlflow_server_records_the_run_with_artifacts_in_s3(runs, s3, mlflow_server):
    _, second, _ = runs
    mlflow = MlflowClient(mlflow_server)
    run = mlflow.get_run(second["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.artifact_uri.startswith("mlflow-artifacts:")
    history = mlflow.get_metric_history(run.info.run_id, "train/lm_loss")
    # 2, 4 from the first run; 6, 8 after resuming at step 4: nothing trained twice or skipped
    assert sorted(m.step for m in history) == [2, 4, 6, 8]
    # read back from the bucket itself, not through MLflow
    prefix = f"mlflow/{run.info.experiment_id}/{run.info.run_id}/artifacts/"
    objects = client(s3).list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]
    names = {o["Key"][len(prefix):] for o in objects}
    assert {"config.yaml", "checkpoint/state.pt", "checkpoint/config.yaml"} <= names, names
    body = client(s3).get_object(Bucket=BUCKET, Key=prefix + "config.yaml")["Body"].read()
    saved = yaml.safe_load(body)
    assert saved["train"]["steps"] == 8 and saved["tracking"]["tracking_uri"] == mlflow_server


def test_checkpoint_on_s3_loads_for_evaluation(runs, s3, monkeypatch):
    """``urm-ray eval`` / ``final`` read a checkpoint straight from its s3:// URI."""
    from urm_ray.evaluate import load_checkpoint

    for key, value in {**FAKE_AWS, "AWS_ENDPOINT_URL": s3}.items():
        monkeypatch.setenv(key, value)
    cfg, model = load_checkpoint(runs[1]["checkpoint"])
    assert cfg.train.steps == 8 and cfg.train.run_name == "s3-resume" and not model.training


def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights(runs, s3, monkeypatch):
    """2 DDP workers, interrupted at step 4 and resumed: each rank's RNG, ACT carry and data
    position come back, so the weights at step 8 equal the uninterrupted run's exactly."""
    import ray.train
    import torch

    from urm_ray.train.checkpoint import load_state

    for key, value in {**FAKE_AWS, "AWS_ENDPOINT_URL": s3}.items():
        monkeypatch.setenv(key, value)
    states = []
    for run in runs[1:]:
        with ray.train.Checkpoint(run["checkpoint"]).as_directory() as folder:
            states.append(load_state(Path(folder)))
    resumed, straight = states
    assert resumed["position"] == straight["position"] and len(resumed["ranks"]) == 2
    for name, value in straight["model"].items():
        assert torch.equal(resumed["model"][name], value), name
    assert not torch.equal(resumed["ranks"][0]["rng"]["torch"], resumed["ranks"][1]["rng"]["torch"])
