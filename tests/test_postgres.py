"""Sweeps on PostgreSQL: Optuna's storage and MLflow's backend in one real server (tests/postgres.py).

- A database that cannot be reached (server down, database missing, ``postgres://`` spelling) fails
  ``urm-ray sweep`` and ``--resume`` at once, before Ray starts, naming the URL without its password.
- cluster/gpu.yaml's commands that set up PostgreSQL on the head, run here as on the head.
- A 3-trial sweep (2 at a time) with ``--storage postgresql://...`` and
  ``MLFLOW_TRACKING_URI=postgresql://...`` (two databases of the server) is interrupted with SIGINT
  after its first finished trial, then ``urm-ray sweep --resume`` finishes it: Optuna's trials,
  MLflow's nested runs and Tune's trials all number what was requested, the rows are in PostgreSQL
  (no SQLite file in the sweep folder), and no run logged a metric step twice (slow).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import psycopg
import pytest
import ray
import yaml
from mlflow.tracking import MlflowClient
from ray import tune

from postgres import find_binaries, unprivileged
from test_cluster import CLUSTER_YAML, TINY_SPACE, free_port, write_tiny_sweep
from test_tune_sweep import InterruptOnce
from urm_ray.cli import main
from urm_ray.redact import redact, strip
from urm_ray.tune.databases import check_reachable
from urm_ray.tune.sweep import create_sweep, run_sweep

SPACE = {**TINY_SPACE, "trials": 3, "concurrency": 2,
         "resources": {"workers": 1, "cpus_per_worker": 0.5}}  # no custom resource: one local node


def test_the_server_runs_unprivileged_and_holds_new_databases(postgres_server):
    url = postgres_server.create_database("probe")
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("probe",)
    uid = next(int(line.split()[1]) for line in
               Path(f"/proc/{postgres_server.process.pid}/status").read_text().splitlines()
               if line.startswith("Uid:"))
    assert uid != 0  # as root, the server runs as the postgres user (PostgreSQL refuses root)


def test_an_unreachable_database_fails_the_sweep_before_ray_starts(postgres_server, tmp_path: Path,
                                                                   capsys, monkeypatch):
    was_up = ray.is_initialized()
    monkeypatch.chdir(tmp_path)
    root = str(tmp_path / "sweeps")
    closed = f"postgresql://urm:s3cret@127.0.0.1:{free_port()}/optuna"  # nothing listens there
    started = time.monotonic()
    assert main(["sweep", "quickstart", "--storage", closed, "--dir", root]) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - started < 30, "should fail at once, not after MLflow's retries (~100 s)"
    assert f"the Optuna storage (--storage) {closed.replace('s3cret', '***')} cannot be reached" in err
    assert "Connection refused" in err and "s3cret" not in err

    missing = postgres_server.url("no_such_db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", missing)
    assert main(["sweep", "quickstart", "--dir", root]) == 2
    err = capsys.readouterr().err
    assert f"the MLflow tracking store (tracking.tracking_uri or MLFLOW_TRACKING_URI) {redact(missing)}" in err
    assert postgres_server.password not in err
    assert 'database "no_such_db" does not exist' in err and "createdb" in err

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgres://urm:s3cret@db.example/mlflow")
    assert main(["sweep", "quickstart", "--dir", root]) == 2
    err = capsys.readouterr().err
    assert "write postgresql://urm:***@db.example/mlflow" in err and "s3cret" not in err

    shared = postgres_server.url("postgres")  # MLflow's and Optuna's schema versions would clash
    monkeypatch.setenv("MLFLOW_TRACKING_URI", shared)
    assert main(["sweep", "quickstart", "--storage", shared, "--dir", root]) == 2
    assert "both keep a table alembic_version, so each needs its own" in capsys.readouterr().err
    assert not Path(root).exists()  # nothing created for a sweep that cannot start

    # --resume checks the URLs its sweep.json holds: the database server went away since
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    info, _ = create_sweep("quickstart", [], "gone", root)
    record = json.loads((info.path / "sweep.json").read_text())
    (info.path / "sweep.json").write_text(json.dumps({**record, "storage": closed}))
    assert main(["sweep", "--resume", "gone", "--dir", root]) == 2
    assert "the Optuna storage (--storage)" in capsys.readouterr().err
    assert ray.is_initialized() == was_up


def test_the_cluster_heads_commands_set_up_postgresql_for_mlflow_and_optuna(monkeypatch):
    """cluster/gpu.yaml's PostgreSQL commands, run here as `ray up` runs them on the head (bash, as
    a non-root user, in a fresh home folder; the port changed to a free one): a password drawn into
    two files only their owner reads, initialised with password authentication only, started,
    both databases created and reachable at the URLs the file gives MLflow and the sweeps, with
    the password from ~/.pgpass and not without it; run again (a second `ray up`), they succeed
    and change nothing."""
    if find_binaries() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    port = str(free_port())
    commands = [c.replace("5432", port) for c in config["head_setup_commands"] + config["head_start_ray_commands"]
                if "initdb" in c or "pg_ctl" in c or "pgpass" in c]
    # install (skipped here: installed), the password, initialise, start + databases
    assert len(commands) == 4
    mlflow = next(c for c in config["head_start_ray_commands"] if "mlflow server" in c)
    tracking_uri = re.search(r"--backend-store-uri (\S+)", mlflow)[1].replace("5432", port)
    storage = re.search(r"--storage (\S+)", CLUSTER_YAML.read_text())[1].replace("5432", port)
    as_user = unprivileged()
    home = Path(tempfile.mkdtemp(prefix="urm-ray-head-"))
    (home / "postgres").mkdir(mode=0o700)  # initialization_commands, on the host
    if as_user:
        for folder in (home, home / "postgres"):
            shutil.chown(folder, as_user["user"], as_user["group"])
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
    secret, pgpass = home / "postgres" / "password", home / ".pgpass"
    try:
        drawn = []
        for _ in range(2):
            for command in commands:
                done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True,
                                      timeout=120, **as_user)
                assert done.returncode == 0, (command, done.stdout, done.stderr)
            drawn.append(secret.read_text())
        assert drawn[0] == drawn[1] and len(drawn[0]) == 64  # hex of 32 random bytes, kept
        assert secret.stat().st_mode & 0o777 == pgpass.stat().st_mode & 0o777 == 0o600
        hba = (home / "postgres" / "data" / "pg_hba.conf").read_text().splitlines()
        rules = [line.split() for line in hba if line.strip() and not line.lstrip().startswith("#")]
        assert rules and all(rule[-1] == "scram-sha-256" for rule in rules), rules  # no `trust`
        monkeypatch.setenv("PGPASSFILE", str(home / "missing"))
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(storage, connect_timeout=10).close()
        monkeypatch.setenv("PGPASSFILE", str(pgpass))  # where libpq finds ~/.pgpass on the head
        check_reachable(tracking_uri, "MLflow")
        check_reachable(storage, "Optuna")
        with psycopg.connect(storage) as conn:
            names = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
            assert {"mlflow", "optuna"} <= names
            assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
    finally:
        pg_ctl = find_binaries() / "pg_ctl"
        subprocess.run([str(pg_ctl), "stop", "-m", "fast", "-D", str(home / "postgres" / "data")],
                       env=env, capture_output=True, timeout=60, **as_user)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_sweep(ray_local, postgres_server, tmp_path_factory):
    """Interrupted after its first finished trial (SIGINT), then resumed through the CLI; then a
    training run of ``urm-ray train`` into the same MLflow database. The URLs carry the server's
    password; what the commands printed and logged is kept for the test that looks for it."""
    root = tmp_path_factory.mktemp("pg")
    space_file, data = write_tiny_sweep(root, SPACE)
    optuna_url = postgres_server.create_database("optuna")
    mlflow_url = postgres_server.create_database("mlflow")
    printed, logged = io.StringIO(), io.StringIO()
    handler, root_logger = logging.StreamHandler(logged), logging.getLogger()
    level = root_logger.level
    root_logger.addHandler(handler)
    root_logger.setLevel(logging.INFO)
    try:
        with pytest.MonkeyPatch.context() as patch, redirect_stdout(printed), redirect_stderr(printed):
            patch.setenv("MLFLOW_TRACKING_URI", mlflow_url)
            patch.chdir(root)  # artifacts of a database store go to ./mlruns
            info, space = create_sweep(str(space_file), [f"data.path={data}"], "pg",
                                       str(root / "sweeps"), storage_url=optuna_url)
            first = run_sweep(info, space, callbacks=[InterruptOnce(root / "interrupted")])
            # sweep.json holds no password: --storage and $MLFLOW_TRACKING_URI give it back
            code = main(["sweep", "--resume", "pg", "--dir", str(root / "sweeps"), "--storage", optuna_url])
            trained = main(["train", "sudoku4-urm", *[f"{k}={v}" for k, v in SPACE["overrides"].items()],
                            f"data.path={data}", "train.run_name=pg-train", "checkpoint.every=2",
                            f"checkpoint.storage_path={root / 'runs'}"])
    finally:
        root_logger.removeHandler(handler)
        root_logger.setLevel(level)
    return {"info": info, "first": first, "code": code, "trained": trained, "root": root,
            "optuna": optuna_url, "mlflow": mlflow_url, "printed": printed.getvalue(),
            "logged": logged.getvalue(), "password": postgres_server.password}


@pytest.mark.slow
def test_a_sweep_on_postgresql_resumes_to_exactly_the_requested_trials(pg_sweep, capsys):
    info = pg_sweep["info"]
    assert info.storage == pg_sweep["optuna"] and info.tracking_uri == pg_sweep["mlflow"]
    recorded = json.loads((info.path / "sweep.json").read_text())
    assert recorded["storage"] == strip(pg_sweep["optuna"]) != pg_sweep["optuna"]
    assert pg_sweep["first"].interrupted and pg_sweep["code"] == 0
    trials = info.study().trials
    assert [t.number for t in trials] == [0, 1, 2] and all(t.state.is_finished() for t in trials)
    with psycopg.connect(pg_sweep["optuna"]) as conn:  # Optuna's own rows, in PostgreSQL
        assert conn.execute("SELECT count(*) FROM trials").fetchone() == (3,)
    assert not list(info.path.glob("*.db"))

    client = MlflowClient(pg_sweep["mlflow"])
    experiment = client.get_experiment_by_name(info.experiment)
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{info.parent_run_id}'")
    assert sorted(r.info.run_name for r in children) == ["pg-t000", "pg-t001", "pg-t002"]
    assert client.get_run(info.parent_run_id).info.status == "FINISHED"
    with psycopg.connect(pg_sweep["mlflow"]) as conn:
        count = conn.execute("SELECT count(*) FROM runs WHERE experiment_id = %s",
                             (int(experiment.experiment_id),)).fetchone()
        assert count == (4,)  # parent + 3 trials

    tune_trials = tune.ExperimentAnalysis(str(info.path / "tune")).trials
    assert len(tune_trials) == 3 and {t.status for t in tune_trials} == {"TERMINATED"}


@pytest.mark.slow
def test_no_trial_run_logged_a_metric_step_twice(pg_sweep):
    client = MlflowClient(pg_sweep["mlflow"])
    info = pg_sweep["info"]
    experiment = client.get_experiment_by_name(info.experiment)
    logged = 0
    for run in client.search_runs([experiment.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{info.parent_run_id}'"):
        for key in run.data.metrics:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            assert len(steps) == len(set(steps)), (run.info.run_name, key, sorted(steps))
            logged += len(steps)
    assert logged > 0


@pytest.mark.slow
def test_no_password_reaches_the_terminal_mlflow_optuna_ray_or_a_file(pg_sweep, postgres_server):
    """The URLs of both databases carried the password through a sweep, its resume and a training
    run: it is in none of what they printed or logged, the rows of MLflow's and Optuna's databases
    (params, tags, artifacts' paths, trial attributes), the files they wrote (sweep.json, configs,
    checkpoints, Tune's state, MLflow's artifacts) or the logs of this Ray instance's processes."""
    secret = pg_sweep["password"].encode()
    assert pg_sweep["code"] == 0 and pg_sweep["trained"] == 0, pg_sweep["printed"][-3000:]
    assert "postgres:***@" in pg_sweep["logged"]  # the URLs were shown, redacted
    assert secret not in pg_sweep["printed"].encode() and secret not in pg_sweep["logged"].encode()
    for database, content in (("mlflow", b"sudoku4"), ("optuna", b"model.loops")):
        dump = subprocess.run([str(find_binaries() / "pg_dump"), "--data-only", pg_sweep[database]],
                              capture_output=True, timeout=120)
        assert dump.returncode == 0, dump.stderr
        assert content in dump.stdout and secret not in dump.stdout, database
    files = [p for p in pg_sweep["root"].rglob("*") if p.is_file()]
    assert any(p.name == "sweep.json" for p in files) and any(p.name == "config.yaml" for p in files)
    assert any(p.name == "state.pt" for p in files)
    leaked = [p for p in files if secret in p.read_bytes()]
    session = Path(ray._private.worker._global_node.get_session_dir_path())  # this Ray instance's
    leaked += [p for p in (session / "logs").rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert leaked == []


@pytest.mark.slow
def test_the_tracking_bench_reads_back_every_point_it_sent(tmp_path: Path):
    """bench/tracking_concurrency.py on its smallest setting (direct stores): its accounting adds
    up (every call counted, every point sent found again once) on both backends."""
    if find_binaries() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    out = tmp_path / "bench.json"
    bench = Path(__file__).resolve().parents[1] / "bench" / "tracking_concurrency.py"
    done = subprocess.run([sys.executable, str(bench), "--writers", "2", "--steps", "3", "--keys", "2",
                           "--rounds", "1", "--modes", "direct", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["backend"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"sqlite", "postgresql"}
    for row in rows.values():
        assert (row["calls"], row["errors"], row["sent"], row["lost"], row["duplicates"]) == (6, 0, 12, 0, 0)
        assert 0 < row["p50_ms"] <= row["p99_ms"]
