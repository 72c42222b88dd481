"""The cluster: cluster/gpu.yaml against Ray's own autoscaler schema, and a sweep on several nodes.

- ``cluster/gpu.yaml`` goes through what ``ray up`` does to it before launching anything
  (``prepare_config``: defaults, docker checks) and the JSON schema shipped inside the ray package;
  the project's rules for it are checked too (instance profile, images, spot/on-demand, S3), and
  who can reach what: the user's own security group (Ray's security-group step run on it), Ray's
  token and a dashboard on 127.0.0.1 (options checked against ``ray start``'s own), MLflow on the
  head's private address; and what ``ray job submit --working-dir .`` leaves out (Ray's own walk
  of a working dir with this repository's .gitignore).
- A local Ray cluster of three nodes on this machine (``ray.cluster_utils.Cluster``) runs a
  2-trial sweep through the ``urm-ray`` CLI: the two worker nodes each offer one ``trial_slot``
  and each trial's worker asks for one, so the trials must land on different nodes, which the
  Ray State API's record of the Train workers confirms; then one of those nodes is removed
  mid-trial, as a reclaimed spot node, and its trial retries from its checkpoint (slow).
- ``--scale-up`` asks Ray's autoscaler for a run's resources and waits for them: unit-tested on a
  simulated cluster, and end to end with the autoscaler's fake multi-node provider (slow).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jsonschema
import pytest
import yaml

import ray
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = ROOT / "cluster" / "gpu.yaml"
SCHEMA = Path(ray.autoscaler.__file__).parent / "ray-schema.json"


# --- helpers shared with test_jobs.py and test_cloud.py -----------------------------------------

TINY_SPACE = {
    "base": "sudoku4-urm",
    "overrides": {
        "model.hidden_size": 16, "model.num_heads": 2, "model.num_layers": 1, "model.expansion": 1.0,
        "model.max_segments": 2, "train.steps": 4, "train.global_batch_size": 8,
        "train.log_every": 2, "eval.every": 4, "checkpoint.every": 0,
        "eval.max_rows": 16, "optim.warmup_steps": 1,
    },
    "params": {"model.loops": {"type": "int", "low": 2, "high": 3},
               "model.truncation": {"type": "int", "low": 0, "high": "model.loops - 1"}},
    "objectives": [{"metric": "eval/token_accuracy", "mode": "max"}],
    "trials": 2,
    "concurrency": 2,
    "resources": {"workers": 1, "cpus_per_worker": 0.5, "custom": {"trial_slot": 1}},
    "scheduler": {"name": "none"},
    "search": {"sampler": "random", "seed": 0},
}


def stop_group(proc: subprocess.Popen, timeout: float = 3) -> None:
    """Stop a process started with ``start_new_session=True`` and everything it spawned (its
    process group): SIGTERM, then SIGKILL if it is still there after ``timeout`` seconds.
    (``ray start --head --block`` takes about 35 s to stop on SIGTERM here; the SIGKILL of its
    group leaves none of its processes behind.)"""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=timeout)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_tiny_sweep(folder: Path, space: dict = TINY_SPACE) -> tuple[Path, Path]:
    """A tiny 4x4 Sudoku dataset and a search space over it; returns (space file, data folder)."""
    from urm_ray.data.tasks import sudoku

    data = folder / "sudoku4"
    sudoku.build_generated(data, size=4, num_train=64, num_test=16, blanks=6, seed=1)
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path, data


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment, with this checkout importable by every Ray process started from it."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


# --- cluster/gpu.yaml ------------------------------------------------------------------------------


@pytest.fixture
def cluster_config() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def test_cluster_yaml_passes_ray_validation(cluster_config):
    prepared = prepare_config(copy.deepcopy(cluster_config))  # what `ray up` does first
    validate_config(prepared)
    jsonschema.validate(cluster_config, json.loads(SCHEMA.read_text()))  # the file as written


@pytest.mark.parametrize("mistake", ["typo_key", "fractional_gpu", "unknown_head"])
def test_validation_catches_mistakes(cluster_config, mistake):
    bad = copy.deepcopy(cluster_config)
    if mistake == "typo_key":
        bad["available_node_types"]["head"]["node_confg"] = {}
    elif mistake == "fractional_gpu":
        bad["available_node_types"]["gpu-spot-a10g"]["resources"]["GPU"] = 0.5
    else:
        bad["head_node_type"] = "nope"
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        validate_config(prepare_config(bad))


def test_node_types_head_spot_and_on_demand(cluster_config):
    types = cluster_config["available_node_types"]
    head = types[cluster_config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0 and "InstanceMarketOptions" not in head["node_config"]
    workers = {name: t for name, t in types.items() if t is not head}
    spot = [t for t in workers.values() if t["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot"]
    on_demand = [t for t in workers.values() if "InstanceMarketOptions" not in t["node_config"]]
    assert len(spot) >= 2 and all(t["resources"]["GPU"] == 1 == t["resources"]["spot_gpu"] for t in spot)
    # each on-demand type offers a resource of its own, one per GPU: an 8-worker run asks for one
    # and so lands on one node of one type
    own = [next(k for k in t["resources"] if k.startswith("ondemand_")) for t in on_demand]
    assert on_demand and len(set(own)) == len(own)
    assert all(t["resources"]["GPU"] == t["resources"][key] > 1 for t, key in zip(on_demand, own))
    assert {t["node_config"]["InstanceType"] for t in on_demand} >= {"p4d.24xlarge", "p5.48xlarge"}
    assert all(t.get("min_workers", 0) == 0 for t in workers.values())  # autoscaled from zero
    for t in types.values():  # credentials from an instance profile, never keys
        assert "instance-profile/" in t["node_config"]["IamInstanceProfile"]["Arn"]


def _options(commands: list[str], program: str) -> dict[str, str]:
    """The options of the one shell command among ``commands`` that runs ``program`` (``"ray
    start"``): ``--name value`` and ``--name=value`` alike, a flag's value ``""``."""
    lines = [c for c in commands if program in c]
    assert len(lines) == 1, (program, lines)
    lexer = shlex.shlex(lines[0], posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    start = next(i for i in range(len(words)) if words[i:i + 2] == program.split())
    found: dict[str, str] = {}
    rest = iter(words[start + 2:])
    for word in rest:
        if not word.startswith("--"):
            break  # the end of the command (`;`, `>`, `&`...)
        name, _, value = word.partition("=")
        found[name] = value
        if not value:
            value = next(rest, "")
            if value.startswith("--"):
                name2, _, value2 = value.partition("=")
                found[name2] = value2
            else:
                found[name] = value
    return found


def test_nodes_are_in_a_security_group_of_your_own(cluster_config):
    """Every node type names the group the user made (SSH from one address, traffic between the
    nodes), so `ray up` creates no group and adds no rule: Ray's own group always opens SSH to
    0.0.0.0/0, and rules this file gave it would be added only when Ray creates the group."""
    from ray.autoscaler._private.aws import config as aws

    types = cluster_config["available_node_types"]
    assert all(t["node_config"]["SecurityGroupIds"] == ["SECURITY_GROUP_ID"] for t in types.values())
    assert "security_group" not in cluster_config["provider"]
    # what `ray up` does about security groups (bootstrap_aws): nothing, without calling AWS
    assert aws._configure_security_group(copy.deepcopy(cluster_config)) == cluster_config
    assert aws._create_default_ssh_inbound_rules()[0]["IpRanges"] == [{"CidrIp": "0.0.0.0/0"}]
    assert "0.0.0.0" not in json.dumps(cluster_config)  # no address open to the world anywhere
    text = CLUSTER_YAML.read_text()
    assert "aws_access_key_id" not in text.lower() and "AWS_SECRET" not in text
    guide = (ROOT / "docs" / "cluster.md").read_text()  # the commands that make the group
    assert "aws ec2 create-security-group" in guide and "UserIdGroupPairs=[{GroupId=$SG}]" in guide
    assert "--cidr \"$MY_IP/32\"" in guide and "0.0.0.0/0 " not in guide.split("## 2.")[0]


def test_ray_asks_for_its_token_and_keeps_the_dashboard_on_the_head(cluster_config):
    from ray._private.authentication.authentication_token_setup import _get_default_token_path
    from ray.scripts.scripts import start

    known = {name for param in start.params for name in param.opts}
    head = _options(cluster_config["head_start_ray_commands"], "ray start")
    worker = _options(cluster_config["worker_start_ray_commands"], "ray start")
    assert set(head) <= known and set(worker) <= known, (set(head) | set(worker)) - known
    assert head["--dashboard-host"] == "127.0.0.1"  # the dashboard and job API: SSH tunnel only
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        line = next(c for c in cluster_config[key] if "ray start" in c)
        assert 0 <= line.find("export RAY_AUTH_MODE=token;") < line.find("ray start"), line
    # Ray's default token file on every node, from the user's own (ray get-auth-token --generate)
    token = "/home/ray/" + str(_get_default_token_path().relative_to(Path.home()))
    assert cluster_config["file_mounts"][token] == "~/.ray/auth_token"
    assert any("'export RAY_AUTH_MODE=token' >> ~/.bashrc" in c for c in cluster_config["setup_commands"])


def test_mlflow_listens_on_the_heads_private_address(cluster_config):
    """Not 127.0.0.1: the trials' rank-0 workers on the GPU nodes log to it; not 0.0.0.0 either."""
    from mlflow.cli import server

    mlflow = _options(cluster_config["head_start_ray_commands"], "mlflow server")
    assert set(mlflow) <= {name for param in server.params for name in param.opts}
    private = "$(hostname -I | awk '{print $1}')"
    assert mlflow["--host"] == private and "--allowed-hosts" not in mlflow  # localhost + private IPs
    head = next(c for c in cluster_config["head_start_ray_commands"] if "ray start" in c)
    assert f"MLFLOW_TRACKING_URI=http://{private}:{mlflow['--port']};" in head
    worker = next(c for c in cluster_config["worker_start_ray_commands"] if "ray start" in c)
    assert f"MLFLOW_TRACKING_URI=http://$RAY_HEAD_IP:{mlflow['--port']};" in worker
    assert "@127.0.0.1:5432/" in mlflow["--backend-store-uri"] and ":" not in (
        mlflow["--backend-store-uri"].split("//")[1].split("@")[0])  # no password in the URL


def test_job_submit_leaves_out_what_runs_write(tmp_path):
    """`ray job submit --working-dir .` uploads the checkout without the folders and databases
    that runs leave there: Ray's own walk of a working dir, with this repository's .gitignore."""
    from ray._private.runtime_env.packaging import _dir_travel

    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    written = ["sweeps/s/study.json", "runs/r/checkpoint_1/state.pt", "mlruns/0/meta.yaml",
               "mlartifacts/1/a.bin", "mlflow.db", "optuna.db", ".venv/bin/python", "data/x/train.npy"]
    kept = ["urm_ray/cli.py", "urm_ray/data/store.py", "search_spaces/urm-sudoku.yaml", "README.md"]
    for name in written + kept:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    seen: list[str] = []
    _dir_travel(tmp_path, [], lambda p: seen.append(p.relative_to(tmp_path).as_posix()),
                include_gitignore=True)
    assert set(kept) <= set(seen)
    # Ray's matcher sees a folder's name without its slash, so `runs/` keeps the empty folder
    # but none of what it holds
    assert not set(written) & set(seen), seen


CHECK_GPUS = ROOT / "cluster" / "check_gpus.sh"


def test_workers_check_their_gpus_before_ray_starts(cluster_config):
    """Every worker runs cluster/check_gpus.sh (copied there by file_mounts) after `ray stop` and
    before `ray start`; Ray's updater stops at the first command that fails."""
    assert cluster_config["file_mounts"]["/home/ray/check_gpus.sh"] == "cluster/check_gpus.sh"
    commands = cluster_config["worker_start_ray_commands"]
    check = commands.index("sh ~/check_gpus.sh")
    assert check < next(i for i, c in enumerate(commands) if "ray start" in c)
    assert commands.index("ray stop") < check


def _fake_bin(folder: Path, gpus_listed: int, gpus_torch: int | None) -> dict[str, str]:
    """PATH with an ``nvidia-smi`` listing ``gpus_listed`` GPUs, and a ``python`` whose PyTorch
    counts ``gpus_torch`` (None: this interpreter, whose CPU PyTorch sees none)."""
    folder.mkdir()
    lines = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})\\n" for i in range(gpus_listed))
    (folder / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{lines}'\n")
    if gpus_torch is not None:
        (folder / "python").write_text(f"#!/bin/sh\necho {gpus_torch}\n")
    else:
        (folder / "python").symlink_to(sys.executable)
    for tool in folder.iterdir():
        tool.chmod(0o755)
    return {"PATH": f"{folder}:/usr/bin:/bin"}


@pytest.mark.parametrize(("listed", "torch_sees", "advertised", "starts"), [
    (8, 8, 8, True),      # the 8-GPU node type, every GPU visible
    (1, 1, 1, True),      # a spot node
    (0, 0, 0, True),      # the head or a CPU node: nothing to check
    (7, 7, 8, False),     # a GPU lost
    (0, 0, 1, False),     # the container started without the NVIDIA runtime
    (1, None, 1, False),  # the driver lists it, PyTorch (here: CPU PyTorch) cannot use it
])
def test_gpu_check_refuses_a_node_that_sees_fewer_gpus(tmp_path: Path, listed, torch_sees, advertised, starts):
    types = yaml.safe_load(CLUSTER_YAML.read_text())["available_node_types"]
    resources = next((t["resources"] for t in types.values() if t["resources"].get("GPU", 0) == advertised),
                     {"CPU": 8, "GPU": advertised})
    env = {**_fake_bin(tmp_path / "bin", listed, torch_sees), "RAY_OVERRIDE_RESOURCES": json.dumps(resources)}
    result = subprocess.run(["sh", str(CHECK_GPUS)], env=env, capture_output=True, text=True)
    assert (result.returncode == 0) == starts, result.stdout + result.stderr
    if not starts:
        assert f"advertises GPU: {advertised}" in result.stderr and "Ray is not started" in result.stderr
    # an explicit count wins over the autoscaler's
    assert subprocess.run(["sh", str(CHECK_GPUS), str(listed)], env=env).returncode == (0 if torch_sees == listed or listed == 0 else 1)


def test_images_storage_and_mlflow(cluster_config):
    docker = cluster_config["docker"]
    assert docker["head_image"].endswith("-cpu") and docker["worker_image"].endswith("-gpu")
    head_start = " ".join(cluster_config["head_start_ray_commands"])
    assert "mlflow server" in head_start and "--artifacts-destination s3://" in head_start
    assert "MLFLOW_TRACKING_URI" in head_start
    assert "MLFLOW_TRACKING_URI" in " ".join(cluster_config["worker_start_ray_commands"])
    for placeholder in ("ACCOUNT_ID", "BUCKET", "IMAGE_TAG", "AMI_ID", "SECURITY_GROUP_ID"):  # each one explained on top
        assert placeholder in CLUSTER_YAML.read_text().split("cluster_name:")[0]


# --- growing an autoscaling cluster (urm_ray.cluster) and custom resources ------------------------


def test_scale_up_asks_waits_and_withdraws(monkeypatch):
    from urm_ray import cluster

    seen, states = [], iter([{"CPU": 0.0}, {"CPU": 4.0}, {"CPU": 8.0, "GPU": 2.0}])
    current = {"CPU": 0.0}

    def resources():
        return current

    def grow(*_):
        current.update(next(states, current))

    monkeypatch.setattr(cluster.ray, "cluster_resources", resources)
    monkeypatch.setattr(cluster.time, "sleep", grow)
    wanted = [{"CPU": 1.0}, {"CPU": 4.0, "GPU": 1.0, "spot": 0.0}, {"CPU": 2.0, "GPU": 1.0}]
    with cluster.scaled_up(wanted, timeout_s=60, request=lambda bundles: seen.append(bundles)):
        assert cluster.holds(current, wanted)
    assert seen == [[{"CPU": 1.0}, {"CPU": 4.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}], []]


def test_scale_up_times_out_naming_what_is_missing(monkeypatch):
    from urm_ray import cluster
    from urm_ray.errors import ConfigError

    monkeypatch.setattr(cluster.ray, "cluster_resources", lambda: {"CPU": 2.0})
    seen = []
    with pytest.raises(ConfigError, match="did not grow"):
        with cluster.scaled_up([{"GPU": 1.0}], timeout_s=0.01, poll_s=0.001,
                              request=lambda bundles: seen.append(bundles)):
            pass
    assert seen[-1] == []  # the request is withdrawn even when the wait fails
    with cluster.scaled_up([{"GPU": 8.0}], timeout_s=0, request=lambda bundles: seen.append(bundles)):  # 0: no request
        pass
    assert len(seen) == 2


def test_ray_train_polls_its_workers_often_unless_the_user_set_it(monkeypatch):
    """Ray's 2 s default delays the end of every run and trial by up to a poll (bench/run_overhead.py)."""
    from ray.train.v2._internal.constants import (
        ENV_VARS_TO_PROPAGATE,
        HEALTH_CHECK_INTERVAL_S_ENV_VAR,
    )

    from urm_ray import cluster

    assert HEALTH_CHECK_INTERVAL_S_ENV_VAR in ENV_VARS_TO_PROPAGATE  # Ray hands it to the controller
    monkeypatch.delenv(HEALTH_CHECK_INTERVAL_S_ENV_VAR, raising=False)
    cluster.ray_train_defaults()
    assert float(os.environ[HEALTH_CHECK_INTERVAL_S_ENV_VAR]) < 2.0
    monkeypatch.setenv(HEALTH_CHECK_INTERVAL_S_ENV_VAR, "5")
    cluster.ray_train_defaults()
    assert os.environ[HEALTH_CHECK_INTERVAL_S_ENV_VAR] == "5"


def test_bundles_and_custom_resources_in_the_plan():
    from urm_ray.config import load_config
    from urm_ray.errors import ConfigError
    from urm_ray.train.workers import worker_bundles
    from urm_ray.tune.resources import plan, trial_bundles
    from urm_ray.tune.space import Resources

    res = Resources(workers=2, cpus_per_worker=4, gpus_per_worker=1, custom={"spot_gpu": 1})
    bundles = trial_bundles(res, 3)
    assert len(bundles) == 1 + 3 * 3 and sum(b.get("GPU", 0) for b in bundles) == 6
    # 4 spot_gpu in the cluster: 2 trials of 2 workers, however many GPUs and CPUs there are
    the_plan = plan({"CPU": 64, "GPU": 16, "spot_gpu": 4}, res, 0, 10)
    assert the_plan.concurrency == 2
    assert the_plan.train_overrides()["resources.worker_resources.spot_gpu"] == 1.0
    with pytest.raises(ConfigError, match="spot_gpu"):
        plan({"CPU": 64, "GPU": 16}, res, 0, 10)
    cfg = load_config("sudoku4-urm", ["resources.num_workers=2", "resources.worker_resources={ondemand: 1}",
                                      "resources.device=cpu"])
    assert worker_bundles(cfg)[1:] == [{"CPU": 1.0, "GPU": 0.0, "ondemand": 1}] * 2
    with pytest.raises(ConfigError, match="worker_resources.GPU"):
        load_config("sudoku4-urm", ["resources.worker_resources={GPU: 1}"])


def test_sweep_keeps_trial_checkpoints_on_the_base_configs_s3_storage(tmp_path: Path):
    """On a cluster every node must reach the trials' checkpoints: a URI storage path is kept."""
    from urm_ray.tune.sweep import create_sweep

    space = tmp_path / "tiny.yaml"
    space.write_text(yaml.safe_dump(TINY_SPACE, sort_keys=False))
    info, _ = create_sweep(str(space), ["checkpoint.storage_path=s3://bucket/urm/runs/"], name="s3",
                           root=str(tmp_path / "sweeps"))
    assert info.runs_path("trials") == "s3://bucket/urm/runs/s3/trials"
    assert info.runs_path("final") == "s3://bucket/urm/runs/s3/final"
    local, _ = create_sweep(str(space), [], name="here", root=str(tmp_path / "sweeps"))
    assert local.runs_path("trials") == str(tmp_path / "sweeps" / "here" / "trials")


# --- a sweep on a local multi-node cluster, and the autoscaler (slow) ------------------------------

# Long enough trials that a node can be taken away mid-run, after a checkpoint: the retry
# resumes there (retries: 1, as GPU spaces have by default).
# retries 2, the default of the GPU spaces (spot nodes): in one of four CI runs a trial failed
# twice around the removal (its fate not recorded then; the assertion below now shows it)
PREEMPTED_SPACE = {**TINY_SPACE, "retries": 2, "overrides": {
    **TINY_SPACE["overrides"], "train.steps": 30, "train.log_every": 5, "eval.every": 30,
    "checkpoint.every": 5}}


def _wait_for_checkpoints(trials: Path, count: int, sweep: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(list(trials.glob("*/checkpoint_*/state.pt"))) < count:
        assert sweep.poll() is None, "the sweep ended before every trial had a checkpoint"
        assert time.monotonic() < deadline, f"no checkpoint of {count} trials in {timeout} s"
        time.sleep(0.2)


@pytest.mark.slow
def test_sweep_trials_land_on_different_nodes_and_survive_a_preempted_one(tmp_path: Path, monkeypatch):
    """Both trials run at once, one per worker node. Once each has a checkpoint, one worker node
    is removed (a reclaimed spot node) and a fresh one joins: the sweep still finishes both
    trials, the one that lost its node retried from its checkpoint, each MLflow run continuous
    (every logged step once, none missing) and closed FINISHED; the sweep's terminal stays quiet."""
    from mlflow.tracking import MlflowClient
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    space, data = write_tiny_sweep(tmp_path, PREEMPTED_SPACE)
    dashboard = free_port()
    # Every Ray process of this cluster (started from here) and the sweep find its State API here.
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", f"http://127.0.0.1:{dashboard}")
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 2, "include_dashboard": True, "dashboard_port": dashboard})
    try:
        nodes = [cluster.add_node(num_cpus=1, resources={"trial_slot": 1}) for _ in range(2)]
        cluster.wait_for_nodes()
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        cmd = [sys.executable, "-m", "urm_ray.cli", "sweep", str(space), "--name", "nodes",
               "--dir", str(tmp_path / "sweeps"), f"data.path={data}", f"tracking.tracking_uri={uri}",
               "resources.shared_fs=true"]  # the nodes are processes of this machine: one filesystem
        # a fresh matplotlib font cache, as on a first sweep: its build is logged unless quiet
        env = subprocess_env(RAY_ADDRESS=cluster.address, MPLCONFIGDIR=str(tmp_path / "mpl"))
        with subprocess.Popen(cmd, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) as sweep:
            _wait_for_checkpoints(tmp_path / "sweeps" / "nodes" / "tune", 2, sweep, 400)
            cluster.remove_node(nodes[0])  # its trial's worker dies with it
            replacement = cluster.add_node(num_cpus=1, resources={"trial_slot": 1})
            out, err = sweep.communicate(timeout=600)
        assert sweep.returncode == 0, out[-3000:] + err[-3000:]
        assert '"finished": 2' in out
        # the terminal shows the sweep, not Ray's, Optuna's or matplotlib's chatter (--verbose does)
        for noise in ("(raylet)", "worker processes have been started", "A new study created", "matplotlib"):
            assert noise not in out + err, (noise, out[-3000:] + err[-3000:])

        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("sweep-nodes")
        trials = [r for r in client.search_runs([experiment.experiment_id])
                  if r.data.tags.get("urm_ray.kind") == "trial"]
        assert len(trials) == 2
        for run in trials:
            assert run.info.status == "FINISHED" and run.data.tags["urm_ray.fate"] == "completed", (
                run.info.run_name, run.info.status, run.data.tags)
            steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/lr")]
            assert steps == list(range(5, 31, 5)), (run.info.run_name, steps)

        deadline = time.monotonic() + 30
        while True:  # the State API is eventually consistent: a finished trial's worker can lag
            workers = list_actors(address=f"http://127.0.0.1:{dashboard}",
                                  filters=[("class_name", "=", "ImplicitFunc")], detail=True,
                                  raise_on_missing_output=False)
            if len(workers) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(1)
        # the State API forgets the node of an actor that died with it (node_id None)
        used = {w.node_id for w in workers if w.node_id}
        # the two first trial actors (each trains its trial), one on each worker node; the retry
        # runs in the survivor (Tune reuses actors) or in a new actor on a node that was left
        assert len(workers) in (2, 3), workers
        assert any(w.state == "DEAD" for w in workers), workers  # the one that lost its node
        assert nodes[1].node_id in used and used <= {
            nodes[0].node_id, nodes[1].node_id, replacement.node_id}
    finally:
        cluster.shutdown()


FAKE_AUTOSCALER = """
cluster_name: fake
max_workers: 1
upscaling_speed: 1.0
idle_timeout_minutes: 5
provider:
  type: fake_multinode
  gcs_address: "{gcs}"
  use_node_id_as_ip: true
  disable_node_updaters: true
  disable_launch_config_check: true
auth: {{ssh_user: ubuntu}}
available_node_types:
  ray.head.default: {{resources: {{CPU: 2}}, node_config: {{}}, max_workers: 0}}
  slot-node: {{resources: {{CPU: 1, slot: 1}}, node_config: {{}}, min_workers: 0, max_workers: 1}}
head_node_type: ray.head.default
file_mounts: {{}}
cluster_synced_files: []
file_mounts_sync_continuously: false
rsync_exclude: []
rsync_filter: []
initialization_commands: []
setup_commands: []
head_setup_commands: []
worker_setup_commands: []
head_start_ray_commands: []
worker_start_ray_commands: []
"""


@pytest.mark.slow
def test_scale_up_grows_an_autoscaling_cluster(tmp_path: Path):
    """``--scale-up`` on a real Ray autoscaler (fake node provider: nodes are local processes).

    The worker asks for a resource only the autoscaled node type offers: without ``--scale-up``
    the run stops at once, naming it; with it the autoscaler starts the node and the run trains.
    """
    from ray._private.services import get_node_ip_address

    _, data = write_tiny_sweep(tmp_path)
    port, dashboard = free_port(), free_port()
    gcs = f"{get_node_ip_address()}:{port}"
    config = tmp_path / "fake.yaml"
    config.write_text(FAKE_AUTOSCALER.format(gcs=gcs))
    temp = tempfile.mkdtemp(prefix="urmf", dir="/tmp")  # Ray's socket paths must stay short
    # Token auth, Ray's default for a `ray start` head: clients need RAY_AUTH_MODE=token too.
    env = subprocess_env(RAY_FAKE_CLUSTER="1", RAY_AUTH_MODE="token",
                         RAY_API_SERVER_ADDRESS=f"http://127.0.0.1:{dashboard}")
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}",
         f"--dashboard-port={dashboard}", f"--ray-client-server-port={free_port()}", "--num-cpus=2",
         f"--autoscaling-config={config}", f"--temp-dir={temp}", "--disable-usage-stats"],
        stdout=(tmp_path / "head.log").open("w"), stderr=subprocess.STDOUT, env=env,
        start_new_session=True)
    try:
        train = [sys.executable, "-m", "urm_ray.cli", "train", "sudoku4-urm", f"data.path={data}",
                 "model.hidden_size=16", "model.num_heads=2", "model.num_layers=1", "model.loops=2",
                 "model.truncation=1", "model.max_segments=2", "model.expansion=1.0",
                 "train.steps=2", "train.global_batch_size=8", "train.log_every=1",
                 "eval.every=0", "eval.max_rows=8", "checkpoint.every=0",
                 "resources.device=cpu", "resources.cpus_per_worker=0.5", "resources.worker_resources.slot=1",
                 f"checkpoint.storage_path={tmp_path / 'runs'}", "tracking.enabled=false",
                 "resources.shared_fs=true"]  # the nodes are processes of this machine: one filesystem
        job_env = subprocess_env(RAY_ADDRESS=gcs, RAY_AUTH_MODE="token",
                                 RAY_API_SERVER_ADDRESS=f"http://127.0.0.1:{dashboard}")
        deadline = time.monotonic() + 120
        while True:  # the head is up when a client can join
            assert head.poll() is None, (tmp_path / "head.log").read_text()[-3000:]
            probe = subprocess.run([sys.executable, "-c", "import ray; ray.init(); print(ray.cluster_resources())"],
                                   env=job_env, capture_output=True, text=True, timeout=60)
            if probe.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert "'slot'" not in probe.stdout, probe.stdout + probe.stderr

        fixed = subprocess.run(train, env=job_env, capture_output=True, text=True, timeout=300)
        assert fixed.returncode == 2 and "worker_resources.slot" in fixed.stderr, fixed.stderr[-2000:]

        start = time.monotonic()
        grown = subprocess.run([*train, "--scale-up", "120"], env=job_env, capture_output=True,
                               text=True, timeout=400)
        assert grown.returncode == 0, grown.stdout[-2000:] + grown.stderr[-3000:]
        assert json.loads(grown.stdout[grown.stdout.rfind("\n{\n") + 1:])["step"] == 2
        print(f"scale-up run {time.monotonic() - start:.0f} s")
    finally:
        stop_group(head)
        shutil.rmtree(temp, ignore_errors=True)


def test_stop_group_stops_the_child_and_what_it_spawned():
    proc = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300; wait"], start_new_session=True)
    time.sleep(0.5)
    stop_group(proc, timeout=5)
    assert proc.poll() is not None
    deadline = time.monotonic() + 10  # the background sleep went with its group (once reaped)
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process group {proc.pid} still alive after stop_group")
    stop_group(proc)  # stopping a stopped group is a no-op
