"""MLflow tracking: URI resolution, run reuse by name, the do-nothing tracker of other ranks."""

from pathlib import Path

from mlflow.tracking import MlflowClient

from urm_ray import tracking


def test_tracking_uri_resolution(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.resolve_tracking_uri("") == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert tracking.resolve_tracking_uri("sqlite:///rel.db") == f"sqlite:///{tmp_path / 'rel.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.resolve_tracking_uri("") == "http://127.0.0.1:5000"
    assert tracking.resolve_tracking_uri("sqlite:////abs/x.db") == "sqlite:////abs/x.db"


def test_open_run_reuses_the_named_run(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    first = tracking.open_run(uri, "exp", "run-a", {"model.loops": 8, "betas": (0.9, 0.95)})
    tracker = tracking.make_tracker(uri, first, is_rank_zero=True)
    tracker.log({"train/loss": 1.5}, step=3)
    tracking.close_run(uri, first)
    again = tracking.open_run(uri, "exp", "run-a", {"model.loops": 8})
    other = tracking.open_run(uri, "exp", "run-b", {})
    assert again == first and other != first
    run = MlflowClient(uri).get_run(first)
    assert run.data.params == {"model.loops": "8", "betas": "[0.9, 0.95]"}
    assert run.data.metrics == {"train/loss": 1.5}
    assert run.info.status == "RUNNING"


def test_other_ranks_get_a_null_tracker(tmp_path: Path):
    assert isinstance(tracking.make_tracker("sqlite:///x.db", "abc", is_rank_zero=False), tracking.NullTracker)
    assert isinstance(tracking.make_tracker("sqlite:///x.db", "", is_rank_zero=True), tracking.NullTracker)
