"""A tracking store that goes away does not fail training: what the run logs meanwhile waits in
memory, in order, and is written once when the store is back.

- a real ``mlflow server`` stopped for 30 s in the middle of an in-process run and started again
  on the same port and store: training reaches its end while it is down, the run finishes, and
  the run's metric history holds every step exactly once; one warning says the store went away,
  one that it is back (slow);
- a store that stays away: ``close`` gives up after its limit with TrackingUnavailable naming the
  steps not written; a missed heartbeat warns once and raises nothing;
- what counts as the store being away (connection refused, a locked SQLite database) and what does
  not (a value the store refuses), on real errors: the latter raises at once.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from urm_ray import heartbeat, tracking
from urm_ray.config import load_config
from urm_ray.errors import TrackingUnavailable
from urm_ray.progress import Progress
from urm_ray.tracking import CHECKPOINT_TAG, MlflowTracker
from urm_ray.train.driver import fit
from urm_ray.train.session import runs_in_process

from test_cloud import Server
from test_cluster import free_port
from tiny import RUN

STEPS, DOWN_AT, DOWN_S = 12, 3, 30.0
TINY = [*RUN, "train.log_every=1", "checkpoint.every=0", f"train.steps={STEPS}"]


@pytest.fixture(autouse=True)
def no_client_retries(monkeypatch):
    """MLflow's client retries each HTTP call for about 4 minutes by itself; without those
    retries a refused connection fails at once, and urm_ray's own retries are what is tested."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")


def start_server(folder: Path, port: int) -> Server:
    """``mlflow server`` on ``port`` over the SQLite store and artifact folder in ``folder``."""
    cmd = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
           "--port", str(port), "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
           "--default-artifact-root", str(folder / "artifacts"), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    return Server(cmd, f"http://127.0.0.1:{port}/health", folder / f"server-{time.time():.0f}.log", env)


class Outage(Progress):
    """The run's progress display, which also stops the server at step ``DOWN_AT`` (from the
    training thread: every later step is logged while it is down) and starts it again on the same
    port and store ``DOWN_S`` seconds later, once training has reached its end."""

    def __init__(self, server: Server, folder: Path, port: int) -> None:
        super().__init__("train", STEPS)
        self.server, self.folder, self.port = server, folder, port
        self.trained = threading.Event()
        self.trained_while_down = False
        self.restarter = threading.Thread(target=self._restart, daemon=True)

    def update(self, done: int, fields: dict[str, str] | None = None) -> None:
        super().update(done, fields)
        if done == DOWN_AT:
            self.server.stop()
            self.stopped = time.monotonic()
            self.restarter.start()

    def phase(self, text: str) -> None:
        super().phase(text)
        if text == "stopping the workers":  # the last step is done and its checkpoint saved
            self.trained.set()

    def _restart(self) -> None:
        self.trained_while_down = self.trained.wait(timeout=300)
        time.sleep(max(0.0, self.stopped + DOWN_S - time.monotonic()))
        self.server = start_server(self.folder, self.port)


@pytest.mark.slow
def test_a_run_outlives_its_tracking_server_and_logs_every_step_once(ray_local, tmp_path: Path, sudoku4: Path,
                                                                     caplog):
    data = sudoku4
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    outage = Outage(start_server(tmp_path, port), tmp_path, port)
    cfg = load_config("sudoku4-urm", [*TINY, f"data.path={data}", f"checkpoint.storage_path={tmp_path / 'runs'}",
                                      f"tracking.tracking_uri={url}", "tracking.experiment=outage",
                                      "train.run_name=outage"])
    assert runs_in_process(cfg)  # the tracker's thread and its warnings are in this process
    try:
        with caplog.at_level(logging.WARNING, logger="urm_ray"):
            result = fit(cfg, progress=outage)
        outage.restarter.join(timeout=400)
        client = MlflowClient(url)  # the restarted server
        run = client.get_run(result.mlflow_run_id)
        history = {key: sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
                   for key in ("train/lr", "train/lm_loss", "time/train_s")}
    finally:
        if outage.restarter.ident is not None:  # a run that failed before the outage never started it
            outage.restarter.join(timeout=400)
        outage.server.stop()
    assert outage.trained_while_down, "training waited for the tracking server"
    assert history == {key: list(range(1, STEPS + 1)) for key in history}
    assert run.info.status == "FINISHED"
    assert run.data.tags[CHECKPOINT_TAG] == result.checkpoint_path
    said = [r.getMessage() for r in caplog.records if r.name == "urm_ray.outbox"]
    assert len([m for m in said if f"{url} unreachable (" in m]) == 1, said
    assert len([m for m in said if f"{url} is back after" in m]) == 1, said


def test_a_store_that_stays_away_fails_the_close_naming_the_steps(tmp_path: Path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    tracker = MlflowTracker(url, "0" * 32, flush_limit_s=1.0)
    for step in (10, 20, 30):
        tracker.log({"train/lr": 1.0, "train/lm_loss": 2.0}, step)  # returns: training goes on
    tracker.log({"train/lr": 1.0}, 20)  # a step already taken is not kept twice
    with pytest.raises(TrackingUnavailable) as raised:
        tracker.close()
    message = str(raised.value)
    assert f"MLflow tracking store {url} still unreachable after waiting 1 s" in message
    assert "the metrics of the 3 reports of steps 10 to 30 not written to MLflow run 000" in message


def test_a_missed_heartbeat_warns_once_and_raises_nothing(caplog):
    url = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="urm_ray.heartbeat"):
        with heartbeat.beating(tracking.Run(url, "0" * 32), every_s=0.05):
            time.sleep(0.5)
    said = [r.getMessage() for r in caplog.records if r.name == "urm_ray.heartbeat"]
    assert len(said) == 1 and said[0].startswith(f"heartbeat of MLflow run {'0' * 32} not written"), said


def test_an_absent_or_locked_store_is_waited_for_and_a_refused_value_raises(tmp_path: Path):
    with pytest.raises(MlflowException) as refused_connection:
        MlflowClient(f"http://127.0.0.1:{free_port()}").get_run("0" * 32)
    db = tmp_path / "locked.db"
    holder = sqlite3.connect(db)
    holder.execute("CREATE TABLE t (x INTEGER)")
    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(sqlite3.OperationalError) as locked:
        sqlite3.connect(db, timeout=0).execute("INSERT INTO t VALUES (1)")
    holder.rollback()
    assert tracking.transient(refused_connection.value) and tracking.transient(locked.value)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri, tracking.open_run(uri, "exp", "run", {}))
    tracker.log({"train/lr": 1.0}, 1)
    with pytest.raises(MlflowException) as refused:
        tracker.log({"x" * 300: 1.0}, 2)  # longer than a metric name may be
        tracker.close()
    assert not tracking.transient(refused.value)
    assert refused.value.get_http_status_code() == 400
