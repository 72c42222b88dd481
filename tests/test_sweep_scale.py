"""A sweep's scale invariants, small (bench/sweep_scale.py runs them at a thousand trials).

- 40 tiny trials, 8 at a time, ASHA on, through ``urm-ray sweep`` on a local Ray cluster of four
  logical nodes (``ray.cluster_utils.Cluster``: a head and three worker nodes, joined through
  RAY_ADDRESS), with PostgreSQL behind both Optuna (``--storage``) and MLflow
  (``MLFLOW_TRACKING_URI``, another database of the same server). The audit
  (``urm_ray.tune.audit``) then finds as many Optuna trials as nested MLflow runs as Tune trials
  as were requested, every requested trial number in both records, a fate on every run, and no
  metric step logged twice; a removed fate tag and a step logged again are caught (slow).
- Metric steps logged twice are found alike by SQL on MLflow's database and through its client.
- The bench's per-trial overhead: a trial's slot on its actor minus its own work.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from urm_ray.tune.audit import audit_sweep
from urm_ray.tune.sweep import load_sweep

_SPEC = importlib.util.spec_from_file_location(
    "sweep_scale", Path(__file__).resolve().parents[1] / "bench" / "sweep_scale.py")
bench = sys.modules[_SPEC.name] = importlib.util.module_from_spec(_SPEC)  # dataclasses look it up
_SPEC.loader.exec_module(bench)

TRIALS, CONCURRENCY = 40, 8


def test_overhead_is_the_slot_on_its_actor_minus_own_work():
    seg = bench.Segment
    segments = [
        seg("t000", "a:1", end=10.0, total_s=3.0, work_s=2.0),  # the actor's first: slot = total
        seg("t002", "a:1", end=14.5, total_s=3.5, work_s=3.0),  # slot 4.5 after t000
        seg("t001", "b:2", end=11.0, total_s=4.0, work_s=3.5),
        seg("t003", "b:2", end=12.0, total_s=0.5, work_s=0.2),  # retried: also on c:3
        seg("t003", "c:3", end=20.0, total_s=6.0, work_s=4.0),
        seg("t004", "c:3", end=23.0, total_s=2.0, work_s=2.5),  # after t003's segment on c:3
    ]
    values, left_out = bench.overheads(segments)
    assert values == pytest.approx({"t000": 1.0, "t002": 1.5, "t001": 0.5, "t004": 0.5})
    assert left_out == 1 and bench.percentiles(list(values.values()))["p50"] == pytest.approx(0.75)
    assert bench.by_quarter(values, 8) == pytest.approx([0.75, 1.5, 0.5, None])  # t000-t001, ...


def test_duplicate_steps_in_sql_and_through_the_client_agree(tmp_path: Path):
    from urm_ray import tracking
    from urm_ray.tune.audit import DuplicateStep, duplicates_by_client, duplicates_in_sql

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_a = tracking.open_run(uri, "sweep-x", "x-t000", {})
    run_b = tracking.open_run(uri, "sweep-x", "x-t001", {})
    client = MlflowClient(uri)
    for step, value in ((10, 0.1), (20, 0.2), (10, 0.3)):  # step 10 twice
        client.log_metric(run_a, "train/lr", value, step=step)
    client.log_metric(run_b, "train/lr", 0.1, step=10)
    client.log_metric(run_b, "eval/acc", 0.5, step=10)
    expected = [DuplicateStep("x-t000", "train/lr", 10, 2)]
    assert duplicates_in_sql(uri, "sweep-x") == duplicates_by_client(uri, "sweep-x") == expected
    assert duplicates_in_sql(uri, "sweep-other") == []


@pytest.mark.slow  # 4-5.5 min on 2 shared cores at load average 20-40: Ray, 4 nodes, 40 trials
def test_forty_trials_on_four_nodes_keep_their_records_in_step(postgres_server, tmp_path: Path,
                                                               monkeypatch):
    started = time.monotonic()
    for key in ("RAY_API_SERVER_ADDRESS", "PYTHONPATH"):  # start_cluster sets them; put back after
        monkeypatch.setenv(key, os.environ.get(key, ""))
    optuna_url = postgres_server.create_database("scale_optuna")
    mlflow_url = postgres_server.create_database("scale_mlflow")
    space = tmp_path / "scale.yaml"
    space.write_text(yaml.safe_dump(bench.scale_space(TRIALS, CONCURRENCY, cpus_per_trial=0.5)))
    cluster = bench.start_cluster(nodes=4, cpus_per_node=2)  # 8 CPUs: 8 trials x 0.5 + Ray Data
    try:
        cmd = bench.sweep_command([str(space), "--name", "scale", "--dir", str(tmp_path / "sweeps"),
                                   "--storage", optuna_url])
        env = {**os.environ, "RAY_ADDRESS": cluster.address, "MLFLOW_TRACKING_URI": mlflow_url}
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    finally:
        cluster.shutdown()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"sweep of {TRIALS} trials: {time.monotonic() - started:.0f} s")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_url)  # sweep.json keeps no password
    info = load_sweep("scale", str(tmp_path / "sweeps"), optuna_url)[0]
    audit = audit_sweep(info, TRIALS)
    print(audit.render())
    assert audit.optuna_trials == audit.mlflow_runs == audit.tune_trials == TRIALS
    assert audit.no_optuna_trial == audit.no_mlflow_run == audit.extra_runs == []
    assert audit.without_fate == [] and audit.duplicate_steps == []
    assert audit.fates.get("pruned", 0) > 0 and audit.fates.get("completed", 0) > 0  # ASHA ran
    assert audit.ok, audit.problems

    client = MlflowClient(mlflow_url)  # the audit sees what it is there to see
    runs = {r.info.run_name: r for r in client.search_runs(
        [client.get_experiment_by_name(info.experiment).experiment_id])}
    client.delete_tag(runs["scale-t003"].info.run_id, "urm_ray.fate")
    client.log_metric(runs["scale-t005"].info.run_id, "train/lr", 0.5, step=10)
    broken = audit_sweep(info, TRIALS)
    assert broken.without_fate == [3] and not broken.ok
    assert [(d.run, d.key, d.step) for d in broken.duplicate_steps] == [("scale-t005", "train/lr", 10)]
    assert any("no fate tag: t003" in p for p in broken.problems)
