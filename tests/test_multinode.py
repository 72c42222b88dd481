"""A sweep on a multi-node Ray cluster with its data and checkpoints on S3 (slow).

A local Ray cluster of three nodes (``ray.cluster_utils.Cluster``: a head and two worker nodes,
each worker node offering one ``trial_slot`` that every trial asks for, so trials run only on the
worker nodes) and a moto S3 server stand in for a cloud cluster. The dataset exists only on S3
(built in a temporary folder, uploaded, and the folder removed before the sweep starts), and
``checkpoint.storage_path`` is an ``s3://`` URL; the sweep folder (``--dir``) holds ``sweep.json``, the
Optuna study and the report on the driver. The driver process is killed once a trial has a
checkpoint on S3, and ``--resume`` finishes the sweep.

What this proves: the trials find their dataset and keep Tune's state and their checkpoints on S3
only (no dataset or checkpoint file under any local folder of the test or of the Ray cluster's
session), a sweep resumes after its driver is killed, and nothing is lost (Optuna trials = MLflow
trial runs = requested, each trial's checkpoints on S3); a local storage path or data path on a
cluster of several nodes is refused before anything runs. What it cannot prove: every node shares
this machine's filesystem, so a stray read of a local path would still succeed here; the test
makes the local copies absent instead and looks for local writes after the fact.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from test_cloud import BUCKET, FAKE_AWS, client, s3  # noqa: F401  (s3: the moto server fixture)
from test_cluster import TINY_SPACE, subprocess_env

pytestmark = pytest.mark.slow

SPACE = {**TINY_SPACE, "trials": 3, "overrides": {
    **TINY_SPACE["overrides"], "train.steps": 2, "train.log_every": 1, "eval.every": 2,
    "checkpoint.every": 1}}


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):  # noqa: F811
    """A head and two worker nodes (one trial_slot each), every Ray process with the S3
    endpoint and credentials in its environment; yields (cluster, environment for the CLI)."""
    from ray.cluster_utils import Cluster

    env = {**FAKE_AWS, "AWS_ENDPOINT_URL": s3, "PYTHONPATH": subprocess_env()["PYTHONPATH"]}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)  # the nodes' processes inherit it
        # one-worker trials train in their Tune trial actors: no Ray Train, no State API to serve
        nodes = Cluster(initialize_head=True, connect=False, head_node_args={
            "num_cpus": 2, "include_dashboard": False})
        try:
            for _ in range(2):
                nodes.add_node(num_cpus=1, resources={"trial_slot": 1})
            nodes.wait_for_nodes()
            mpl = tmp_path_factory.mktemp("mpl")
            yield nodes, subprocess_env(**env, RAY_ADDRESS=nodes.address, MPLCONFIGDIR=str(mpl))
        finally:
            nodes.shutdown()


def upload_dataset(folder: Path, endpoint: str, prefix: str) -> str:
    """Build a tiny 4x4 Sudoku dataset in ``folder``, upload it under ``prefix``, remove the
    local copy; returns its s3:// URL."""
    from urm_ray.data.tasks import sudoku

    sudoku.build_generated(folder, size=4, num_train=64, num_test=16, blanks=6, seed=1)
    s3 = client(endpoint)
    for path in folder.rglob("*"):
        if path.is_file():
            s3.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(folder)}")
    shutil.rmtree(folder)
    return f"s3://{BUCKET}/{prefix}"


def keys(endpoint: str, prefix: str) -> list[str]:
    pages = client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def sweep_cmd(folder: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "urm_ray.cli", "sweep", *args, "--dir", str(folder / "sweeps")]


def test_sweep_on_three_nodes_keeps_data_and_checkpoints_on_s3_and_resumes(cluster, s3, tmp_path):  # noqa: F811
    from mlflow.tracking import MlflowClient

    nodes, env = cluster
    data = upload_dataset(tmp_path / "sudoku4", s3, "data/sudoku4")
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE, sort_keys=False))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [f"data.path={data}", f"checkpoint.storage_path=s3://{BUCKET}/runs", f"tracking.tracking_uri={uri}"]
    with subprocess.Popen(sweep_cmd(tmp_path, str(space), "--name", "mn", *args), env=env, cwd=tmp_path,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as first:
        deadline = time.monotonic() + 420
        while not any(k.endswith("/state.pt") for k in keys(s3, "runs/mn/tune/")):
            assert first.poll() is None, first.communicate()[1][-3000:]
            if time.monotonic() > deadline:
                first.kill()
                out, err = first.communicate()
                pytest.fail(f"no trial checkpoint on S3 in 420 s: {out[-2000:]} {err[-4000:]}")
            time.sleep(0.2)
        first.send_signal(signal.SIGKILL)  # the driver dies; Ray ends its trial actors
        first.communicate()
    resumed = subprocess.run(sweep_cmd(tmp_path, "--resume", "mn"), env=env, cwd=tmp_path, text=True,
                             capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert '"finished": 3' in resumed.stdout, resumed.stdout[-2000:]

    import optuna

    study = optuna.load_study(study_name="mn", storage=f"sqlite:///{tmp_path / 'sweeps' / 'mn' / 'optuna.db'}")
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE"] * 3
    mlflow = MlflowClient(uri)
    experiment = mlflow.get_experiment_by_name("sweep-mn")
    trials = [r for r in mlflow.search_runs([experiment.experiment_id])
              if r.data.tags.get("urm_ray.kind") == "trial"]
    assert sorted(r.info.run_name for r in trials) == [f"mn-t{n:03d}" for n in range(3)]
    assert all(r.info.status == "FINISHED" for r in trials), [(r.info.run_name, r.info.status) for r in trials]

    stored = keys(s3, "runs/mn/")
    for number in range(3):  # each trial's checkpoints (keep 2 of steps 1 and 2), in Tune's storage
        saved = [k for k in stored if k.startswith(f"runs/mn/tune/t{number:03d}/checkpoint_")
                 and k.endswith("/state.pt")]
        assert saved, (number, stored)
    assert any(k.startswith("runs/mn/tune/experiment_state") for k in stored), stored
    # mlruns/ is the MLflow artifact store of the test's SQLite tracking URI (the checkpoint each
    # run uploads to MLflow); on a cluster that is the head's server, storing to S3 (test_cloud.py)
    local = [tmp_path, Path(nodes.head_node.get_session_dir_path())]
    written = [p for root in local for p in root.rglob("*") if p.name in ("state.pt", "metadata.json")
               or p.suffix == ".parquet"]
    assert written and all(p.is_relative_to(tmp_path / "mlruns") for p in written), written


def test_local_storage_or_data_is_refused_on_several_nodes(cluster, s3, tmp_path):  # noqa: F811
    nodes, env = cluster
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE, sort_keys=False))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    from urm_ray.data.tasks import sudoku

    local_data = tmp_path / "sudoku4"
    sudoku.build_generated(local_data, size=4, num_train=16, num_test=16, blanks=6, seed=1)
    refused = subprocess.run(
        sweep_cmd(tmp_path, str(space), "--name", "local", f"data.path={local_data}",
                  f"tracking.tracking_uri={uri}"),
        env=env, cwd=tmp_path, text=True, capture_output=True, timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert f"data.path={local_data}" in line and "3 nodes" in line and "s3://" in line, line
    assert "resources.shared_fs=true" in line and "Traceback" not in refused.stderr
    assert not (tmp_path / "sweeps" / "local").exists()  # nothing left: the same name works once fixed
