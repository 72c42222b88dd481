"""``ray job submit --working-dir . -- urm-ray sweep ...`` to a local cluster of three nodes (slow).

The cluster workflow's submit step, on one machine: a head (2 CPUs, the job API on its dashboard)
and two worker nodes that each offer one ``trial_slot`` (``ray.cluster_utils.Cluster``: real
GCS, raylets and dashboard, as processes of this test). A 2-trial sweep is submitted with the
checkout as working directory; each trial's worker asks for a ``trial_slot``, so the trials must
land on different nodes, which the Ray State API's record of the Train workers confirms. The job
runs the head's Python; the uploaded working directory is what makes this checkout's ``urm_ray``
the one imported by the job and by every trial and Train worker.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_cluster import ROOT, free_port, subprocess_env, write_tiny_sweep

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).parent / "ray")
# The upload skips what .gitignore lists too; these are named so that a checkout without that
# .gitignore (or with local sweeps and runs lying around) still uploads only the code.
# Ray's default for a local head: token auth (the head writes ~/.ray/auth_token if missing). The
# job CLI only sends the token when told to, as a user's shell would be told with this variable.
AUTH_MODE = "token"
EXCLUDES = [".venv", ".git", "runs", "sweeps", "mlflow.db", "mlruns", "data", "**/__pycache__"]


@pytest.fixture
def cluster(monkeypatch):
    """Head (2 CPUs, dashboard) + two 1-CPU nodes with one ``trial_slot`` each; yields
    (dashboard URL, the worker nodes' ids)."""
    from ray.cluster_utils import Cluster

    url = f"http://127.0.0.1:{free_port()}"
    # Every Ray process of this cluster inherits these: Train's placement-group cleaner finds
    # this head's State API even when other Ray instances run on the machine (see
    # urm_ray.tune.sweep.init_ray), and a job's entrypoint finds this Python's `urm-ray`, as an
    # activated environment (or the cluster's image) would.
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", url)
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 2, "include_dashboard": True, "dashboard_port": int(url.rsplit(":", 1)[1])})
    try:
        # Nodes of one machine share its session folder: each unpacks the job's working
        # directory into a folder of its own, as on separate machines (a shared one is replaced
        # under the running job when the next node unpacks it).
        nodes = [cluster.add_node(num_cpus=1, resources={"trial_slot": 1},
                                  runtime_env_dir_name=f"runtime_resources_node{i}") for i in range(2)]
        cluster.wait_for_nodes()
        _wait_for_jobs_api(url)
        yield url, {n.node_id for n in nodes}
    finally:
        cluster.shutdown()


def _wait_for_jobs_api(url: str, timeout: float = 120) -> None:
    import urllib.error
    import urllib.request

    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=2)
        except urllib.error.HTTPError:
            pass  # it answers (401 without the token: Ray's token auth is on by default)
        except OSError:
            time.sleep(0.5)
            continue
        print(f"job API up in {time.monotonic() - start:.1f} s")
        return
    raise RuntimeError(f"no Ray job API at {url} after {timeout} s")


def _ray_job(args: list[str], url: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = subprocess_env(RAY_API_SERVER_ADDRESS=url, RAY_AUTH_MODE=AUTH_MODE)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([RAY, "job", *args, "--address", url], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _wait_for_job(url: str, job_id: str, timeout: float) -> str:
    """The job's final state (succeeded, failed, stopped), or its last one at the timeout.

    Through the CLI, as a user would: Ray's auth mode is read once per process, so an in-process
    JobSubmissionClient would keep whatever mode an earlier test's Ray left behind.
    """
    deadline, state = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        out = _ray_job(["status", job_id], url)
        found = re.search(rf"Job '{job_id}' (succeeded|failed|stopped|is running|is pending)",
                          out.stdout + out.stderr)
        state = found[1] if found else (out.stdout + out.stderr)[-500:]
        if state in ("succeeded", "failed", "stopped"):
            break
        time.sleep(3)
    return state


def test_submitted_sweep_runs_its_trials_on_different_nodes(cluster, tmp_path: Path):
    from ray.util.state import list_actors

    url, slot_nodes = cluster
    space_file, data = write_tiny_sweep(tmp_path)
    sweep = ["urm-ray", "sweep", str(space_file), "--name", "job", "--dir", str(tmp_path / "sweeps"),
             f"data.path={data}", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    where = "python -c 'import urm_ray; print(\"urm_ray from\", urm_ray.__file__)'"
    entrypoint = ["bash", "-c", f"{where} && {shlex.join(sweep)}"]
    runtime_env = json.dumps({"excludes": EXCLUDES})
    start = time.monotonic()
    submit = ["submit", "--no-wait", "--submission-id", "urm-sweep", "--working-dir", str(ROOT),
              "--runtime-env-json", runtime_env, "--", *entrypoint]
    for _ in range(30):  # the job API answers before the head's agent takes jobs: retry, as it says
        submitted = _ray_job(submit, url)
        if "No available agent to submit job" not in submitted.stderr:
            break
        time.sleep(2)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    status = _wait_for_job(url, "urm-sweep", timeout=480)
    print(f"job round trip {time.monotonic() - start:.0f} s")
    printed = _ray_job(["logs", "urm-sweep"], url)
    logs = printed.stdout + printed.stderr
    assert status == "succeeded", status + logs[-4000:]
    assert '"finished": 2' in logs
    assert (tmp_path / "sweeps" / "job" / "leaderboard.csv").is_file()
    # the job imported the uploaded working directory, not an installed copy
    imported = next(line for line in logs.splitlines() if line.startswith("urm_ray from"))
    assert "working_dir_files" in imported and str(ROOT) not in imported, imported
    # one trial per trial_slot node
    workers = list_actors(address=url, filters=[("class_name", "=", "RayTrainWorker")], detail=True,
                          raise_on_missing_output=False)
    assert len(workers) == 2 and {w.node_id for w in workers} == slot_nodes, workers
