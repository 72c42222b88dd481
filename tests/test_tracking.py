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


def test_a_restarted_worker_logs_each_step_once(tmp_path: Path):
    """A run restored from its step-10 checkpoint after a crash at step 15 replays steps 11-15:
    MLflow keeps the first value of each step, and the steps after the crash are logged."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run_id = tracking.open_run(uri, "exp", "crashy", {})
    before = tracking.make_tracker(uri, run_id, is_rank_zero=True)
    for step in (5, 10, 15):
        before.log({"train/lr": 1.0, "train/lm_loss": float(step)}, step)
    after = tracking.make_tracker(uri, run_id, is_rank_zero=True)  # the restarted worker
    for step in (15, 20):
        after.log({"train/lr": 1.0, "train/lm_loss": 100.0 + step}, step)
    history = MlflowClient(uri).get_metric_history(run_id, "train/lm_loss")
    assert [(m.step, m.value) for m in history] == [(5, 5.0), (10, 10.0), (15, 15.0), (20, 120.0)]
