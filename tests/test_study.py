"""``urm-ray study``: a tiny one-row study killed (SIGKILL) after its first sweep finished and run
again, its table checked against MLflow; bad study files refused before any work; the shipped
study files load."""

from __future__ import annotations

import csv
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import yaml
from mlflow.tracking import MlflowClient

from urm_ray.cli import main
from urm_ray.study.baselines import BASELINES, BENCHMARKS, FAMILIES
from urm_ray.study.check import check_study
from urm_ray.study.spec import load_study
from urm_ray.study.table import Cell

REPO = Path(__file__).resolve().parent.parent
METRICS = ["eval/exact_accuracy", "eval/token_accuracy"]
KILL_WAIT_S = 900  # the first sweep must finish within this, on a loaded machine too


def _space(data: Path, uri: str) -> dict:
    return {
        "base": "sudoku4-urm",
        "overrides": {
            "model.hidden_size": 16, "model.num_heads": 2, "model.num_layers": 1, "model.expansion": 1.0,
            "train.steps": 2, "train.global_batch_size": 8, "train.log_every": 1, "eval.every": 2,
            "checkpoint.every": 2, "eval.max_rows": 8, "optim.warmup_steps": 1,
            "data.path": str(data), "tracking.tracking_uri": uri,
        },
        "params": {"model.loops": {"type": "int", "low": 2, "high": 3},
                   "optim.lr": {"type": "log_float", "low": 1.0e-4, "high": 3.0e-3}},
        "objectives": [{"metric": "eval/token_accuracy", "mode": "max"}],
        "trials": 2,
        "resources": {"workers": 1, "cpus_per_worker": 0.4},
        "scheduler": {"name": "none"},
        "search": {"seed": 0, "startup_trials": 2},
    }


STUDY = {
    "name": "tiny",
    "protocol": {"trials": 2, "top": 2, "recheck_seeds": 1, "seeds": 2, "metrics": METRICS,
                 "final": {"train.steps": 2}},
    "rows": [{"name": "one", "space": "tiny.yaml", "family": "urm", "task": "sudoku4"}],
}


def _study_command(root: Path, *extra: str) -> subprocess.Popen:
    import ray

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}  # the session's Ray
    return subprocess.Popen([sys.executable, "-m", "urm_ray.cli", "study", "study.yaml", *extra],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def study(ray_local, sudoku_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    (root / "tiny.yaml").write_text(yaml.safe_dump(_space(sudoku_data(num_train=64, num_test=16), uri)))
    (root / "study.yaml").write_text(yaml.safe_dump(STUDY, sort_keys=False))
    sweeps = root / "studies" / "tiny" / "sweeps"
    first = _study_command(root)
    deadline = time.monotonic() + KILL_WAIT_S
    while not list(sweeps.glob("*/best_config.yaml")) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    finished = sorted(p.parent.name for p in sweeps.glob("*/best_config.yaml"))
    first.send_signal(signal.SIGKILL)
    killed_output = first.communicate()[0]
    killed_at = time.time()
    assert finished, killed_output[-3000:]
    second = _study_command(root, "--resume")
    output = second.communicate(timeout=KILL_WAIT_S)[0]
    assert second.returncode == 0, output[-3000:]
    return {"root": root, "uri": uri, "finished": finished, "killed_at": killed_at,
            "killed_rc": first.returncode, "output": output}


def _final_runs(uri: str, row: str):
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=[f"sweep-tiny-{row}"],
                              filter_string=f"tags.`urm_ray.study_row` = '{row}' and attributes.status = 'FINISHED'")
    return runs.sort_values("tags.urm_ray.seed")


@pytest.mark.slow
def test_the_study_was_killed_after_its_first_sweep_and_finished_on_resume(study):
    assert study["killed_rc"] == -signal.SIGKILL
    assert (study["root"] / "studies" / "tiny" / "table.md").is_file()
    assert "| one | sudoku4 | urm |" in study["output"]


@pytest.mark.slow
def test_the_resume_ran_nothing_twice(study):
    client = MlflowClient(study["uri"])
    for row in ("one",):
        experiment = client.get_experiment_by_name(f"sweep-tiny-{row}")
        names = [r.info.run_name for r in client.search_runs([experiment.experiment_id], max_results=1000)]
        assert len(names) == len(set(names)), names  # each trial, re-check and final seed once
        assert sorted(n for n in names if n.startswith(f"tiny-{row}-t")) == [f"tiny-{row}-t000", f"tiny-{row}-t001"]
        assert len(_final_runs(study["uri"], row)) == 2
    # the sweep finished before the kill kept its trials: none started again after it
    sweep = study["finished"][0]
    experiment = client.get_experiment_by_name(f"sweep-{sweep}")
    runs = client.search_runs([experiment.experiment_id])
    trials = [r for r in runs if r.data.tags.get("urm_ray.kind") == "trial"]
    assert len(trials) == 2 and all(r.info.start_time / 1000 < study["killed_at"] for r in trials)
    assert all(r.info.status == "FINISHED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]


@pytest.mark.slow
def test_the_table_is_what_mlflow_holds(study):
    with open(study["root"] / "studies" / "tiny" / "table.csv") as f:
        written = {(r["row"], r["metric"]): r for r in csv.DictReader(f)}
    assert len(written) == 2
    for row in ("one",):
        runs = _final_runs(study["uri"], row)
        for metric in METRICS:
            values = list(runs[f"metrics.{metric}"])
            cell = written[(row, metric)]
            assert int(cell["n"]) == len(values) == 2
            assert math.isclose(float(cell["mean"]), statistics.fmean(values), abs_tol=1e-12)
            if statistics.stdev(values) > 0:
                assert math.isclose(float(cell["sd"]), statistics.stdev(values), abs_tol=1e-12)
            else:
                assert float(cell["sd"]) == 0.0
            assert float(cell["ci_low"]) <= float(cell["mean"]) <= float(cell["ci_high"])
        assert float(written[(row, METRICS[0])]["device_hours"]) > 0


@pytest.mark.slow
def test_the_table_is_logged_to_a_study_run_with_a_child_per_row(study):
    client = MlflowClient(study["uri"])
    experiment = client.get_experiment_by_name("study-tiny")
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.info.run_name == "tiny")
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == ["tiny-one"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"table.md", "table.csv", "report.html"}
    page = (study["root"] / "studies" / "tiny" / "report.html").read_text()  # the study's own page
    assert "<h2>Results</h2>" in page and ">one<" in page
    values = list(_final_runs(study["uri"], "one")[f"metrics.{METRICS[1]}"])
    assert math.isclose(children["tiny-one"].data.metrics[f"{METRICS[1]}/mean"], statistics.fmean(values))


def test_a_cells_interval_is_students_t():
    cell = Cell("m", (0.5, 0.7, 0.9))
    half = 4.302652729911275 * 0.2 / math.sqrt(3)  # t(0.975, 2) x sd / sqrt(n)
    assert math.isclose(cell.ci[0], 0.7 - half) and math.isclose(cell.ci[1], 0.7 + half)


def _write_study(tmp_path: Path, study: dict) -> Path:
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(_space(tmp_path / "data", "")))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@pytest.mark.parametrize("change, named", [
    ({"protocol": {"seedz": 3}}, "unknown key protocol.seedz (did you mean protocol.seeds?)"),
    ({"protocol": {"seeds": 1}}, "protocol.seeds=1"),
    ({"protocol": {"metrics": ["accuracy"]}}, "protocol.metrics: 'accuracy'"),
    ({"rows": [{"name": "one", "space": "tiny.yaml", "family": "trm"}]}, "rows[0] (one).family='trm'"),
    ({"rows": [{"name": "one", "space": "nowhere.yaml", "family": "urm"}]}, "rows[0] (one).space"),
    ({"rows": [{"name": "one", "space": "tiny.yaml", "family": "urm", "benchmark": "sudoku"}]},
     "rows[0].benchmark='sudoku'"),
    ({"rows": [{"name": "one", "space": "tiny.yaml", "family": "urm", "overrides": {"model.loopz": 2}}]},
     "model.loopz"),
])
def test_a_bad_study_file_fails_with_a_named_error_before_any_work(tmp_path: Path, capsys, change, named):
    study = {**STUDY, **change}
    if "protocol" in change:
        study["protocol"] = {**STUDY["protocol"], **change["protocol"]}
    path = _write_study(tmp_path, study)
    assert main(["study", str(path), "--dir", str(tmp_path / "studies")]) == 2
    err = capsys.readouterr().err
    assert named in err and str(path) in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "studies").exists()


def test_the_shipped_studies_load_and_the_paper_tasks_are_planned():
    families = load_study(str(REPO / "studies" / "sudoku4-families.yaml"))
    assert {r.spec.family for r in families.rows} >= {"urm", "trm"}
    paper = load_study(str(REPO / "studies" / "paper-tasks.yaml"))
    assert {r.spec.benchmark for r in paper.rows} <= set(BENCHMARKS)
    report, _ = check_study(paper, "h100")
    for row in paper.rows:
        assert f"  {row.name}: " in report and "GiB peak" in report.split(f"  {row.name}: ")[1].splitlines()[0]


def test_every_published_figure_has_a_source_and_a_known_cell():
    for b in BASELINES:
        assert b.family in FAMILIES and b.benchmark in BENCHMARKS and b.source and 0 < b.value < 1
    assert {(b.family, b.benchmark, b.value) for b in BASELINES} >= {
        ("urm", "arc-agi-1", 0.538), ("urm", "arc-agi-2", 0.160), ("urm", "sudoku-extreme", 0.776),
        ("trm", "arc-agi-1", 0.400), ("hrm", "arc-agi-1", 0.344)}


def test_rows_run_side_by_side_only_when_the_cluster_has_room_for_every_sweep(tmp_path: Path):
    from urm_ray.study.run import rows_at_once

    two = {**STUDY, "rows": [*STUDY["rows"], {**STUDY["rows"][0], "name": "two"}]}
    rows = load_study(str(_write_study(tmp_path, two))).rows
    # each tiny sweep: 2 trials x 0.4 CPU, and 1 CPU its data loading keeps free
    assert rows_at_once(rows, {"CPU": 2.0}) == 1
    assert rows_at_once(rows, {"CPU": 3.6}) == 2
    assert rows_at_once(rows, {"CPU": 3.5, "GPU": 8.0}) == 1
