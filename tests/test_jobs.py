"""``ray job submit --working-dir . -- urm-ray sweep ...`` against a head started here (slow).

The cluster workflow's submit step, on one machine: ``ray start --head`` (its own ports and temp
folder, in its own process group, stopped by killing that group: never ``ray stop``, which stops
every Ray instance of the user), then a 2-trial sweep submitted with the checkout as working
directory. The job runs the head's Python; the uploaded working directory is what makes this
checkout's ``urm_ray`` the one imported by the job and by every trial and Train worker. Each trial
has 2 workers, as on a GPU cluster: Ray Train's controller and workers run it, with the sweep's
report callback.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from urm_ray.tracking import KIND_TAG

from test_cluster import ROOT, TINY_SPACE, free_port, stop_group, subprocess_env, write_tiny_sweep

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).parent / "ray")
# The upload skips what .gitignore lists too; these are named so that a checkout without that
# .gitignore (or with local sweeps and runs lying around) still uploads only the code.
# Ray's default for a local head: token auth (the head writes ~/.ray/auth_token if missing). The
# job CLI only sends the token when told to, as a user's shell would be told with this variable.
AUTH_MODE = "token"
EXCLUDES = [".venv", ".git", "runs", "sweeps", "mlflow.db", "mlruns", "data", "**/__pycache__"]


@pytest.fixture
def head():
    """A Ray head of 2 CPUs with the dashboard (the job API); yields the dashboard URL."""
    temp = tempfile.mkdtemp(prefix="urmj", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    port, dashboard = free_port(), free_port()
    url = f"http://127.0.0.1:{dashboard}"
    cmd = [RAY, "start", "--head", "--block", f"--port={port}", f"--dashboard-port={dashboard}",
           "--dashboard-host=127.0.0.1", f"--ray-client-server-port={free_port()}",
           f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
           f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
           "--num-cpus=2", f"--temp-dir={temp}", "--disable-usage-stats"]
    # RAY_API_SERVER_ADDRESS: Train's placement-group cleaner finds this head's State API even when
    # other Ray instances run on the machine (see urm_ray.cluster.init_ray).
    env = subprocess_env(RAY_API_SERVER_ADDRESS=url, RAY_AUTH_MODE=AUTH_MODE)
    env.pop("RAY_ADDRESS", None)
    # A job's entrypoint runs with the PATH of `ray start`: put this Python's `urm-ray` on it, as
    # an activated environment (or the cluster's image) would.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    log = Path(temp) / "ray-start.log"
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        _wait_for_jobs_api(url, proc, log)
        yield url
    finally:
        stop_group(proc)
        shutil.rmtree(temp, ignore_errors=True)


def _wait_for_jobs_api(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    import urllib.error
    import urllib.request

    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited: {log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"{url}/api/version", timeout=2)
        except urllib.error.HTTPError:
            pass  # it answers (401 without the token: Ray's token auth is on by default)
        except OSError:
            time.sleep(0.5)
            continue
        print(f"head up in {time.monotonic() - start:.1f} s")
        return
    raise RuntimeError(f"no Ray head at {url} after {timeout} s: {log.read_text()[-3000:]}")


def _ray_job(args: list[str], url: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = subprocess_env(RAY_API_SERVER_ADDRESS=url, RAY_AUTH_MODE=AUTH_MODE)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([RAY, "job", *args, "--address", url], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _submit(args: list[str], url: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``ray job submit``, retried while the head's job agent is still starting: the dashboard
    answers before it, and a submission then fails with "No available agent to submit job, please
    try again later" (seen on a loaded 2-core machine; the job is not registered)."""
    deadline = time.monotonic() + timeout
    while True:
        submitted = _ray_job(["submit", *args], url)
        if "No available agent" not in submitted.stderr or time.monotonic() > deadline:
            return submitted
        time.sleep(2)


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


def test_ray_job_submit_runs_a_sweep(head: str, tmp_path: Path):
    space = {**TINY_SPACE, "resources": {"workers": 2, "cpus_per_worker": 0.2}}
    space_file, data = write_tiny_sweep(tmp_path, space)
    sweep = ["urm-ray", "sweep", str(space_file), "--name", "job", "--dir", str(tmp_path / "sweeps"),
             f"data.path={data}", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    where = "python -c 'import urm_ray; print(\"urm_ray from\", urm_ray.__file__)'"
    entrypoint = ["bash", "-c", f"{where} && {shlex.join(sweep)}"]
    runtime_env = json.dumps({"excludes": EXCLUDES})
    start = time.monotonic()
    submitted = _submit(["--no-wait", "--submission-id", "urm-sweep",
                         "--working-dir", str(ROOT), "--runtime-env-json", runtime_env,
                         "--", *entrypoint], head)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    status = _wait_for_job(head, "urm-sweep", timeout=480)
    print(f"job round trip {time.monotonic() - start:.0f} s")
    printed = _ray_job(["logs", "urm-sweep"], head)
    logs = printed.stdout + printed.stderr
    assert status == "succeeded", status + logs[-4000:]
    assert '"finished": 2' in logs
    assert (tmp_path / "sweeps" / "job" / "leaderboard.csv").is_file()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    trials = [r for r in client.search_runs(experiments) if r.data.tags.get(KIND_TAG) == "trial"]
    assert len(trials) == 2
    for run in trials:  # trained on Ray Train's 2 workers, every objective reported through them
        assert run.data.params["resources.num_workers"] == "2" and "eval/token_accuracy" in run.data.metrics
    # the job imported the uploaded working directory, not an installed copy
    imported = next(line for line in logs.splitlines() if line.startswith("urm_ray from"))
    assert "working_dir_files" in imported and str(ROOT) not in imported, imported
