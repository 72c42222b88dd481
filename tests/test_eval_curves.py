"""Test-time compute end to end on a real run: the curves a training run logs at each evaluation,
and `urm-ray eval` with test-time settings on its checkpoint (real Ray Data, real MLflow store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from urm_ray.config import load_config
from urm_ray.evaluate import Request, evaluate, log
from urm_ray.eval.config import EvalConfig
from urm_ray.train.driver import fit

pytestmark = pytest.mark.slow
TESTTIME = Request("testtime")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, ray_local, sudoku_data) -> tuple[Path, str, dict]:
    root = tmp_path_factory.mktemp("curves")
    data = sudoku_data(num_train=300, num_test=40, blanks=8)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    cfg = load_config("sudoku4-urm", [
        f"data.path={data}", f"checkpoint.storage_path={root / 'runs'}", f"tracking.tracking_uri={uri}",
        "tracking.experiment=curves", "train.steps=40", "eval.every=20", "checkpoint.every=0",
        "train.log_every=20", "train.global_batch_size=32", "model.hidden_size=32", "model.num_heads=2",
        "model.max_segments=3", "eval.curves=true", "eval.width=4", "eval.noise=0.3",
        "eval.select=q", "train.run_name=curves", "resources.in_process=true",
    ])
    result = fit(cfg)
    return root, uri, {"mlflow_run_id": result.mlflow_run_id, "checkpoint": result.checkpoint_path}


def test_a_run_logs_its_curves_at_each_evaluation(trained):
    root, uri, metrics = trained
    client = MlflowClient(uri)
    run = client.get_run(metrics["mlflow_run_id"])
    keys = {k for k in run.data.metrics if k.startswith("eval/curves/")}
    points = {f"depth_{k}" for k in (1, 2, 3)} | {f"width_{w}" for w in (1, 2, 4)}
    assert keys == {f"eval/curves/{point}" for point in points} | {
        f"eval/curves/{point.replace('_', '_valid_')}" for point in points} | {"eval/curves/passes_per_puzzle"}
    for key in ("eval/curves/depth_3", "eval/curves/width_4"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [20, 40]
    assert run.data.metrics["eval/curves/passes_per_puzzle"] == 4 * 3 * 4  # width x segments x loops
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "curves")}
    assert plots == {"curves/step-0000020.png", "curves/step-0000040.png"}
    for value in (run.data.metrics[k] for k in keys - {"eval/curves/passes_per_puzzle"}):
        assert 0.0 <= value <= 1.0


def test_eval_with_test_time_settings_reports_and_logs(trained):
    root, uri, metrics = trained
    checkpoint = metrics["checkpoint"]
    settings = EvalConfig(width=4, noise=0.3, select="q", segments=5)
    evaluated = evaluate(checkpoint, settings, TESTTIME)
    report = json.loads(json.dumps(evaluated.as_dict()))  # as --out writes it
    assert (report["width"], report["segments"], report["select"], report["rows"]) == (4, 5, "q", 40)
    assert report["eval/testtime/passes_per_puzzle"] == 4 * 5 * 4
    assert list(report["depth_curve"]) == ["1", "2", "3", "4", "5"]
    assert report["eval/testtime/exact_accuracy"] == report["eval/testtime/q_exact_accuracy"]
    assert report["eval/testtime/oracle_exact_accuracy"] >= max(report["eval/testtime/vote_exact_accuracy"],
                                                                report["eval/testtime/q_exact_accuracy"])
    assert "exact_accuracy" not in report  # one name per number: the one MLflow logs
    client = MlflowClient(uri)
    run = client.get_run(log(evaluated))
    assert run.info.run_name == "curves/eval-test-w4-n0.3-q-s5"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/testtime/width_exact")] == [1, 2, 4]
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"testtime.png", "eval-test.json"}

    # width 1 without noise, at the trained depth: the plain evaluation
    same = evaluate(checkpoint, EvalConfig(segments=3), TESTTIME).metrics
    plain = evaluate(checkpoint, EvalConfig()).metrics
    assert same["eval/testtime/exact_accuracy"] == plain["eval/exact_accuracy"]
    assert same["eval/testtime/valid_accuracy"] == plain["eval/valid_accuracy"]


def test_eval_over_the_tasks_views(trained):
    root, uri, metrics = trained
    checkpoint = metrics["checkpoint"]
    evaluated = evaluate(checkpoint, EvalConfig(width=4, views=True), TESTTIME)
    report = evaluated.as_dict()
    assert (report["views"], report["width"], report["rows"]) == (True, 4, 40)
    assert report["eval/testtime/oracle_exact_accuracy"] >= report["eval/testtime/vote_exact_accuracy"]
    run = MlflowClient(uri).get_run(log(evaluated))
    assert run.info.run_name == "curves/eval-test-w4-n0-views-vote-s3"
    # one view, the puzzle itself: the plain evaluation
    alone = evaluate(checkpoint, EvalConfig(views=True), TESTTIME).metrics
    assert alone["eval/testtime/exact_accuracy"] == evaluate(checkpoint, EvalConfig()).metrics["eval/exact_accuracy"]
