"""MLflow behind a small interface: ``log(metrics, step)``, ``log_artifact(path)``, ``close()``.

The only module that imports mlflow, on first use: importing it takes seconds, and the ranks
other than 0 never log (nor does rank 0 before its first report). The driver opens (or
re-opens, on resume) the run and passes its id to the workers; rank 0 logs into it through a
``MlflowTracker``, every other rank gets a ``NullTracker``. The tracker writes from a thread of
its own and rides out a tracking store that goes away for a while (``MlflowTracker``). Runs are found again by the tag
``urm_ray.run_name``, so a resumed training run keeps logging into the same MLflow run instead
of starting a second one. Sweeps use the helpers at the end: runs found by name, nested runs,
tags, artifacts, model registry.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import requests

if TYPE_CHECKING:
    from mlflow.entities import RunTag
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

from urm_ray import outbox, redact
from urm_ray.errors import TrackingUnavailable
from urm_ray.outbox import Outbox, one_line

logger = logging.getLogger(__name__)

T = TypeVar("T")

RUN_NAME_TAG = "urm_ray.run_name"
PARENT_TAG = "mlflow.parentRunId"
FATE_TAG = "urm_ray.fate"  # completed, pruned, failed
REASON_TAG = "urm_ray.fate_reason"
KIND_TAG = "urm_ray.kind"  # sweep, trial, final (none: a run of `urm-ray train`)
SWEEP_TAG = "urm_ray.sweep"
TRIAL_TAG = "urm_ray.trial"
CHECKPOINT_TAG = "urm_ray.checkpoint"  # the final checkpoint (folder or URI) of a finished run
HEARTBEAT_TAG = "urm_ray.heartbeat"  # unix time of the driver's last beat (`urm_ray.heartbeat`)
DRIVER_TAG = "urm_ray.driver"  # host:pid of the process that trains the run (`train.resume`)
# + a config key: its value since a resume changed it (the param keeps the first start's value)
RESUMED_TAG_PREFIX = "urm_ray.resumed."
# The experiment's kind as MLflow 3 records it (what its UI's experiment-type setting writes;
# values in mlflow/server/js: genai_development, custom_model_development, ...): every experiment
# urm_ray creates or logs into is model training. MLflow 3.17's own UI picks its view by the
# browser's GenAI / Model training switch instead: see ``ui_url``.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
UI_DEFAULT = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
_BATCH_LIMIT = 100  # MLflow accepts at most 100 params per log_batch call
_DATASET_ATTEMPTS = 3  # log_inputs tries: the dataset's insert races with concurrent runs
_METRIC_LIMIT = 1000  # MLflow accepts at most 1000 metrics per log_batch call
# How long the end of a run waits for an unreachable tracking store to write what the run logged
# (then TrackingUnavailable); a failed run waits FAILED_FLUSH_S, its own error being the news.
FLUSH_LIMIT_S = 600.0
FAILED_FLUSH_S = 10.0


class Tracker(Protocol):
    def connect(self) -> None: ...
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def close(self, limit_s: float | None = None) -> None: ...


class NullTracker:
    """What non-zero ranks (and runs with tracking disabled) get: does nothing."""

    def connect(self) -> None:
        pass

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        pass

    def set_tags(self, tags: dict[str, str]) -> None:
        pass

    def close(self, limit_s: float | None = None) -> None:
        pass


def transient(err: BaseException) -> bool:
    """Whether another try may succeed: the store is unreachable, overloaded or locked (connection
    errors, HTTP 5xx and 429, SQLite's "database is locked"), not refusing the request (4xx)."""
    if "database is locked" in str(err):
        return True
    errors = sys.modules.get("mlflow.exceptions")  # not loaded yet: no MLflow call has failed
    if errors is not None and isinstance(err, errors.MlflowException):
        status = err.get_http_status_code()
        return status >= 500 or status == 429
    return isinstance(err, (ConnectionError, TimeoutError, requests.ConnectionError, requests.Timeout))


@dataclass
class _Report:
    """The metrics of one report, stamped when logged: a write tried again repeats the stamp, and
    MLflow keeps one row per key, step, stamp and value, so a write that landed before its reply
    was lost is not doubled."""

    step: int
    timestamp_ms: int
    metrics: dict[str, float]


@dataclass
class _Extra:
    """Tags or an artifact, written in their place among the reports."""

    what: str  # for messages: "artifact curves/step-0000100.png"
    write: Callable[[MlflowClient, str], None]  # (client, run id)


class MlflowTracker:
    """Logs into an existing MLflow run by id, from a thread of its own (``outbox.Outbox``).

    At most one value per metric and step, whatever restarts happened: a run resumed from a
    checkpoint replays the steps between that checkpoint and the crash, and those steps (up to
    the last one the run already logged, ``logged_until``) are not logged a second time; nor is
    a step this tracker was given already.

    The store may go away for a while (a restarted tracking server, a long SQLite lock): a write
    that fails for a ``transient`` reason is tried again with backoff while training goes on,
    what is logged meanwhile waits in memory in order, and a warning says when the store went
    away and when it is back. ``close`` waits up to ``flush_limit_s`` for the rest, then raises
    TrackingUnavailable naming what was not written. Metrics the store refuses for good (a 4xx)
    raise at the next ``log`` or at ``close``; tags and artifacts refused so are warned about.
    """

    def __init__(self, tracking_uri: str, run_id: str, step_key: str = "train/lr",
                 flush_limit_s: float = FLUSH_LIMIT_S) -> None:
        self.tracking_uri = tracking_uri
        self._client: MlflowClient | None = None  # made at the first write, in the writer's thread
        self.run_id, self.step_key, self.flush_limit_s = run_id, step_key, flush_limit_s
        self.logged_until: int | None = None  # read from the store before the first write
        self._last_step = -1
        self._spool: Path | None = None  # artifacts' copies, kept until written
        self._outbox = Outbox(self._write, transient, f"MLflow tracking store {redact.redact(tracking_uri)}")

    def connect(self) -> None:
        """Makes the store's client and reads the run's last logged step in the writer's thread,
        now, without waiting for it: the first ``log`` (which waits for its write) then finds them
        ready instead of loading MLflow. Called where the run waits anyway (its first batch)."""

        def read(client: MlflowClient, run_id: str) -> None:
            if self.logged_until is None:
                self.logged_until = _logged_until(client, run_id, self.step_key)

        self._outbox.put(_Extra("the run's last logged step (read)", read), wait=False)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if step <= self._last_step:
            return
        self._last_step = step
        values = {k: float(v) for k, v in metrics.items()}
        self._outbox.put(_Report(step, int(time.time() * 1000), values))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Logs a copy of ``path`` (a file or a folder): the caller may remove it at once."""
        if self._spool is None:
            self._spool = Path(tempfile.mkdtemp(prefix="urm_ray-mlflow-"))
        folder = Path(tempfile.mkdtemp(dir=self._spool))
        copy = folder / Path(path).name
        if Path(path).is_dir():
            shutil.copytree(path, copy)
        else:
            shutil.copy2(path, copy)

        def write(client: MlflowClient, run_id: str) -> None:
            _log_artifact(client, run_id, copy, artifact_path)
            shutil.rmtree(folder, ignore_errors=True)

        self._outbox.put(_Extra(f"artifact {Path(artifact_path or '', copy.name)}", write))

    def set_tags(self, tags: dict[str, str]) -> None:
        batch = _run_tags(tags)
        self._outbox.put(_Extra(f"tags {', '.join(tags)}", lambda client, run_id: client.log_batch(
            run_id, tags=batch)))

    def close(self, limit_s: float | None = None) -> None:
        """Waits until everything logged is written, up to ``limit_s`` (None: ``flush_limit_s``)."""
        limit = self.flush_limit_s if limit_s is None else limit_s
        try:
            unwritten = self._outbox.close(limit)
        finally:
            if self._spool is not None:
                shutil.rmtree(self._spool, ignore_errors=True)
        if unwritten:
            raise TrackingUnavailable(self._not_written(unwritten, limit))

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = _client(self.tracking_uri)
        return self._client

    def _write(self, items: list[_Report | _Extra]) -> int:
        """Writes the leading reports (as many as one call takes), else the leading tags or
        artifact; returns how many items that was."""
        if isinstance(items[0], _Extra):
            try:
                items[0].write(self.client, self.run_id)
            except Exception as err:
                if transient(err):
                    raise
                logger.warning("%s not written to MLflow run %s: %s", items[0].what, self.run_id,
                               one_line(err))
            return 1
        if self.logged_until is None:
            self.logged_until = _logged_until(self.client, self.run_id, self.step_key)
        reports: list[_Report] = []
        for item in items:
            if not isinstance(item, _Report) or (
                    reports and sum(len(r.metrics) for r in reports) + len(item.metrics) > _METRIC_LIMIT):
                break
            reports.append(item)
        from mlflow.entities import Metric

        batch = [Metric(k, v, r.timestamp_ms, r.step) for r in reports if r.step > self.logged_until
                 for k, v in r.metrics.items()]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)
        return len(reports)

    def _not_written(self, items: list[_Report | _Extra], limit_s: float) -> str:
        steps = [item.step for item in items if isinstance(item, _Report)]
        lost = [item.what for item in items if isinstance(item, _Extra)]
        if steps:
            lost.insert(0, f"the metrics of step {steps[0]}" if len(steps) == 1 else
                        f"the metrics of the {len(steps)} reports of steps {steps[0]} to {steps[-1]}")
        error = self._outbox.last_error
        return (f"{self._outbox.store} still unreachable after waiting {limit_s:.0f} s for it"
                f"{f' ({one_line(error)})' if error is not None else ''}: {' and '.join(lost)} not "
                f"written to MLflow run {self.run_id} (checkpoints are not affected)")


def _logged_until(client: MlflowClient, run_id: str, step_key: str = "train/lr") -> int:
    """The last step at which the run logged ``step_key`` (-1: none)."""
    return max((m.step for m in client.get_metric_history(run_id, step_key)), default=-1)


def _log_artifact(client: MlflowClient, run_id: str, path: Path, artifact_path: str | None) -> None:
    if path.is_dir():
        client.log_artifacts(run_id, str(path), artifact_path)
    else:
        client.log_artifact(run_id, str(path), artifact_path)


def _run_tags(tags: dict[str, str]) -> list[RunTag]:
    from mlflow.entities import RunTag

    return [RunTag(k, redact.strip(str(v))) for k, v in tags.items()]


def _client(tracking_uri: str) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri)


def retried(what: str, call: Callable[[], T], limit_s: float = FLUSH_LIMIT_S) -> T:
    """``call()``, an MLflow call at the end of a run, tried again while the store is away (as
    ``MlflowTracker`` does), for up to ``limit_s``; then TrackingUnavailable naming ``what``."""
    try:
        return outbox.retried(call, transient, what, limit_s)
    except Exception as err:
        if not transient(err):
            raise
        raise TrackingUnavailable(f"{what}: the MLflow tracking store stayed unreachable for "
                                  f"{limit_s / 60:.0f} min ({one_line(err)})") from err


@contextmanager
def sqlite_creation_lock(tracking_uri: str) -> Iterator[None]:
    """For an SQLite store: an exclusive lock on its folder while held, so that commands started
    together on a new store create its tables one at a time (two migrations at once fail with
    "table _alembic_tmp_experiments already exists"). Other stores: no lock."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    folder = os.open(Path(tracking_uri[len("sqlite:///"):]).parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)  # released when the descriptor closes
        yield
    finally:
        os.close(folder)


@contextmanager
def store_opening(tracking_uri: str, run: tuple[str, str] | None = None) -> Iterator[Callable[[], RunSummary | None]]:
    """Open the MLflow store in a thread while the block runs (the driver starts Ray meanwhile):
    a new SQLite store creates its tables first, about 2.5 s here. Joined before the block's end,
    so no other MLflow call races with it. ``run``: (experiment, run name) of a run to read back
    in the same thread; the block yields what returns it once the block has ended (None: no such
    run). A store that fails to open fails again there, with its message (or at the caller's
    first real call)."""
    found: list[RunSummary | None] = []

    def open_store() -> None:
        try:
            with sqlite_creation_lock(tracking_uri):
                _client(tracking_uri).search_experiments(max_results=1)
            if run is not None:
                found.append(find_summary(tracking_uri, *run))
        except Exception:  # noqa: BLE001 (reported by the caller's own call)
            pass

    def previous() -> RunSummary | None:
        if run is None:
            return None
        return found[0] if found else find_summary(tracking_uri, *run)

    thread = threading.Thread(target=open_store, name="urm_ray-mlflow-store", daemon=True)
    thread.start()
    try:
        yield previous
    finally:
        thread.join()


def open_run(
    tracking_uri: str,
    experiment: str,
    run_name: str,
    params: dict[str, Any],
    tags: dict[str, str] | None = None,
) -> str:
    """Create the MLflow run for ``run_name``, or reuse the one a previous attempt created."""
    from mlflow.entities import Param

    client = _client(tracking_uri)
    experiment_id = _experiment_id(client, experiment)
    existing = find_run(client, experiment_id, run_name)
    if existing is not None:
        client.update_run(existing, status="RUNNING")
        return existing
    all_tags = redact.strip({RUN_NAME_TAG: run_name, **(tags or {})})
    run = client.create_run(experiment_id, run_name=run_name, tags=all_tags)
    items = [Param(k, _param_value(v)) for k, v in params.items()]
    for start in range(0, len(items), _BATCH_LIMIT):
        client.log_batch(run.info.run_id, params=items[start : start + _BATCH_LIMIT])
    return run.info.run_id


def find_run(client: MlflowClient, experiment_id: str, run_name: str) -> str | None:
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'", max_results=1
    )
    return runs[0].info.run_id if runs else None


def _experiment_id(client: MlflowClient, name: str) -> str:
    """The experiment's id, created if missing, and marked as model training (``EXPERIMENT_KIND_TAG``)
    unless it already says what kind it is."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
        except MlflowException:  # another process created it between the two calls
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if EXPERIMENT_KIND_TAG not in experiment.tags:  # made by an older urm_ray, or by hand
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    return experiment.experiment_id


def _is_duplicate(err: MlflowException) -> bool:
    """A unique-key violation (SQLite, PostgreSQL, MySQL wording), directly or through a server."""
    text = str(err).lower()
    return "unique constraint" in text or "duplicate" in text


def _param_value(value: Any) -> str:
    """A param as MLflow records it, with no secret (``redact.strip``: a URL's password)."""
    return redact.strip(str(list(value) if isinstance(value, tuple) else value))


def log_dataset(tracking_uri: str, run_id: str, name: str, path: str, digest: str,
                profile: dict[str, Any]) -> None:
    """Record the run's dataset folder as its MLflow dataset input (the runs table's Dataset
    column): name, digest, location and a ``profile`` (task, split sizes). Metadata only, as
    MLflow's MetaDataset, but built as the entity itself: MetaDataset carries no profile, and
    resolving a local path to a source warns that it is ambiguous. ``source_type="local"`` with
    ``{"uri": path}`` is MLflow's own local source, so ``mlflow.data.get_source`` reads it back.
    Logging the same dataset again (a resumed run) adds nothing.

    MLflow checks whether the experiment has the dataset, then inserts it: two runs starting
    together on the same data (a sweep's concurrent trials) race, and the loser's insert breaks
    the dataset's unique key. That one retries, and then finds the dataset already there."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    dataset = Dataset(name=name, digest=digest, source_type="local",
                      source=json.dumps({"uri": redact.strip(path)}), profile=json.dumps(profile))
    inputs = [DatasetInput(dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, "training")])]
    client = _client(tracking_uri)
    for attempt in range(_DATASET_ATTEMPTS):
        try:
            client.log_inputs(run_id, datasets=inputs)
            return
        except MlflowException as err:
            if not _is_duplicate(err) or attempt == _DATASET_ATTEMPTS - 1:
                raise


class Run:
    """One MLflow run, opened once (``Run.open``) and passed down: everything a run writes into
    itself or reads back of itself goes through this handle. ``NullRun`` stands in when tracking
    is disabled, so callers never ask whether there is a run."""

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        self.tracking_uri, self.id = tracking_uri, run_id

    @classmethod
    def open(cls, tracking_uri: str, experiment: str, run_name: str, params: dict[str, Any],
             tags: dict[str, str] | None = None) -> Run:
        """The run of ``run_name``: created, or the one a previous attempt created, reopened."""
        return cls(tracking_uri, open_run(tracking_uri, experiment, run_name, params, tags))

    @classmethod
    def find(cls, tracking_uri: str, experiment: str, run_name: str) -> Run | None:
        """The run a previous attempt created under ``run_name`` (None: none yet)."""
        run_id = find_run_id(tracking_uri, experiment, run_name)
        return None if run_id is None else cls(tracking_uri, run_id)

    def __bool__(self) -> bool:
        return True

    def tracker(self, rank_zero: bool) -> Tracker:
        """What the loop logs through: rank 0 logs into this run, every other rank does nothing."""
        return MlflowTracker(self.tracking_uri, self.id) if rank_zero else NullTracker()

    def summary(self) -> RunSummary:
        run = _client(self.tracking_uri).get_run(self.id)
        return _summary(run)

    def tags(self) -> dict[str, str]:
        return self.summary().tags

    def set_tags(self, tags: dict[str, str]) -> None:
        _client(self.tracking_uri).log_batch(self.id, tags=_run_tags(tags))

    def delete_tags(self, keys: list[str]) -> None:
        client = _client(self.tracking_uri)
        tags = client.get_run(self.id).data.tags
        for key in keys:
            if key in tags:
                client.delete_tag(self.id, key)

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        """Logs at once, unless the run already logged ``step`` (as ``MlflowTracker`` does)."""
        from mlflow.entities import Metric

        client = _client(self.tracking_uri)
        if step > _logged_until(client, self.id):
            now = int(time.time() * 1000)
            client.log_batch(self.id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def accumulate(self, added: dict[str, float]) -> None:
        """Adds to running totals: each key's latest value plus its addition, logged at the next
        step of that key (one step per call, none logged twice), so the latest value is the total."""
        client = _client(self.tracking_uri)
        for key, value in added.items():
            history = client.get_metric_history(self.id, key)
            before = max(history, key=lambda m: m.step).value if history else 0.0
            client.log_metric(self.id, key, before + value, step=len(history))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        _log_artifact(_client(self.tracking_uri), self.id, Path(path), artifact_path)

    def log_config(self, text: str, name: str = "config.yaml") -> None:
        """``text`` (the resolved config as YAML) as the artifact ``name``."""
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / name
            path.write_text(text)
            self.log_artifact(path)

    def log_dataset(self, name: str, path: str, digest: str, profile: dict[str, Any]) -> None:
        log_dataset(self.tracking_uri, self.id, name, path, digest, profile)

    def metric_history(self, key: str) -> list[tuple[int, float]]:
        """(step, value) of every logged value of ``key``, in logging order."""
        return [(m.step, m.value) for m in _client(self.tracking_uri).get_metric_history(self.id, key)]

    def close(self, status: str = "FINISHED") -> None:
        _client(self.tracking_uri).set_terminated(self.id, status=status)

    def fail(self, status: str, reason: str | None = None) -> None:
        """Close the run as ``status`` (FAILED, KILLED); ``reason``: why it failed, recorded as its
        fate (``failed``) first."""
        if reason is not None:
            self.set_tags({FATE_TAG: "failed", REASON_TAG: reason})
        self.close(status)

    def finish(self, checkpoint: str | None = None, upload: Path | None = None) -> None:
        """The trained run's last records, each tried again while the store is away (``retried``):
        training is over and its checkpoint saved, so only a store still away after
        ``FLUSH_LIMIT_S`` fails. ``checkpoint``: the final checkpoint's folder or URI, as the tag
        ``urm_ray.checkpoint`` (for ``urm-ray runs``); ``upload``: that checkpoint's local copy,
        uploaded as the artifact ``checkpoint``."""
        if checkpoint is not None:
            retried("the checkpoint tag", lambda: self.set_tags({CHECKPOINT_TAG: checkpoint}))
        if upload is not None:
            retried("the checkpoint's upload to MLflow", lambda: self.log_artifact(upload, "checkpoint"))
        retried("closing the MLflow run", lambda: self.close("FINISHED"))

    def register_torch_model(self, model: Any, registered_name: str, extra_files: list[str],
                             tags: dict[str, str]) -> str:
        return register_torch_model(self.tracking_uri, self.id, model, registered_name, extra_files, tags)


class NullRun:
    """The run of a config with tracking disabled: records nothing, reads back nothing."""

    id = None
    tracking_uri = ""

    def __bool__(self) -> bool:
        return False

    def tracker(self, rank_zero: bool) -> Tracker:
        return NullTracker()

    def tags(self) -> dict[str, str]:
        return {}

    def set_tags(self, tags: dict[str, str]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        pass

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        pass

    def log_config(self, text: str, name: str = "config.yaml") -> None:
        pass

    def log_dataset(self, name: str, path: str, digest: str, profile: dict[str, Any]) -> None:
        pass

    def fail(self, status: str, reason: str | None = None) -> None:
        pass

    def finish(self, checkpoint: str | None = None, upload: Path | None = None) -> None:
        pass


def run_of(tracking_uri: str, run_id: str) -> Run | NullRun:
    """The handle of a run opened elsewhere (a Ray Train worker gets the driver's id; "": none)."""
    return Run(tracking_uri, run_id) if run_id else NullRun()



# --- sweeps: finding runs again, tags, artifacts, the model registry --------------------------


@dataclass
class RunSummary:
    """What a sweep reads back from a run."""

    run_id: str
    run_name: str
    status: str  # RUNNING, FINISHED, KILLED, FAILED
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]  # latest value of each metric
    experiment: str = ""
    experiment_id: str = ""
    start_ms: int = 0  # unix milliseconds
    end_ms: int | None = None  # None while it runs


def _summary(run: Any, experiment: str = "") -> RunSummary:
    return RunSummary(run.info.run_id, run.info.run_name, run.info.status, dict(run.data.tags),
                      dict(run.data.params), dict(run.data.metrics), experiment, run.info.experiment_id,
                      run.info.start_time or 0, run.info.end_time)


def find_run_id(tracking_uri: str, experiment: str, run_name: str) -> str | None:
    """The run a previous attempt created under ``run_name`` (tag ``urm_ray.run_name``)."""
    client = _client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    return find_run(client, found.experiment_id, run_name) if found is not None else None


def find_summary(tracking_uri: str, experiment: str, run_name: str) -> RunSummary | None:
    """What the run a previous attempt created under ``run_name`` holds (None: no such run)."""
    found = Run.find(tracking_uri, experiment, run_name)
    return None if found is None else found.summary()


def count_runs(tracking_uri: str, experiment: str) -> int:
    """How many runs (any state) the experiment holds; 0 when it does not exist."""
    client = _client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    return len(client.search_runs([found.experiment_id], max_results=10000)) if found else 0


def child_runs(tracking_uri: str, experiment: str, parent_run_id: str) -> list[RunSummary]:
    """Runs whose ``mlflow.parentRunId`` is ``parent_run_id``, oldest first."""
    client = _client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    runs = client.search_runs([found.experiment_id], f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                              max_results=10000, order_by=["attributes.start_time ASC"])
    return [_summary(r, experiment) for r in runs]


_PAGE = 500  # runs per search call when nested runs are skipped


def matching_runs(tracking_uri: str, experiment: str, filter_string: str = "") -> list[RunSummary]:
    """Every run of ``experiment`` that ``filter_string`` (MLflow's search syntax) selects, read a
    page at a time; [] when the experiment does not exist."""
    client = _client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    runs: list[RunSummary] = []
    token = None
    while found is not None:
        page = client.search_runs([found.experiment_id], filter_string, max_results=_PAGE, page_token=token)
        runs += [_summary(r, experiment) for r in page]
        token = page.token
        if not token:
            break
    return runs


def search_runs(tracking_uri: str, experiment: str = "", max_results: int = 1000,
                top_level: bool = False) -> list[RunSummary]:
    """The runs of ``experiment`` (of every experiment when empty), newest first; ``top_level``:
    only runs that are nobody's child (a sweep's trials stay under their sweep), read a page at a
    time until ``max_results`` are found."""
    client = _client(tracking_uri)
    names = {e.experiment_id: e.name for e in client.search_experiments()}
    ids = [i for i, name in names.items() if not experiment or name == experiment]
    found: list[RunSummary] = []
    token = None
    while ids and len(found) < max_results:
        page = client.search_runs(ids, max_results=max_results if not top_level else _PAGE,
                                  order_by=["attributes.start_time DESC"], page_token=token)
        found += [_summary(r, names[r.info.experiment_id]) for r in page if not (top_level and PARENT_TAG in r.data.tags)]
        token = page.token
        if not top_level or not token:
            break
    return found[:max_results]


def ui_url(tracking_uri: str, experiment_id: str, run_id: str = "") -> str:
    """The MLflow UI's page of an experiment's runs (or of one run) in its model-training view.

    MLflow 3.17's UI opens every experiment in its GenAI view (traces, quality checks) until the
    browser is switched to "Model training" (kept in the browser's local storage); the experiment
    tag ``EXPERIMENT_KIND_TAG`` does not change that, the page's ``workflowType`` parameter does.
    A tracking server's page is on that server; a local store's, where `mlflow ui` serves it by
    default."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else UI_DEFAULT
    page = f"experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{base}/#/{page}?workflowType=machine_learning"


def experiments_with_runs(tracking_uri: str, experiment: str = "") -> dict[str, str]:
    """Name -> id of the experiments (``experiment`` only, when given) that hold a run."""
    client = _client(tracking_uri)
    return {e.name: e.experiment_id for e in client.search_experiments()
            if (not experiment or e.name == experiment)
            and client.search_runs([e.experiment_id], max_results=1)}


def run_ui_url(tracking_uri: str, run_id: str, experiment: bool = False) -> str:
    """``ui_url`` of one run (``experiment``: of the runs of its experiment, e.g. a sweep's trials)."""
    run = _client(tracking_uri).get_run(run_id)
    return ui_url(tracking_uri, run.info.experiment_id, "" if experiment else run_id)


def register_torch_model(tracking_uri: str, run_id: str, model: Any, registered_name: str,
                         extra_files: list[str], tags: dict[str, str]) -> str:
    """Log ``model`` (a torch module) into the run and register it; returns the version."""
    import mlflow
    import mlflow.pytorch
    import torch

    mlflow.set_tracking_uri(tracking_uri)
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pytorch.log_model(
            model, name="model", registered_model_name=registered_name, extra_files=extra_files,
            serialization_format="pickle",  # the ACT forward (carry, batch) is not traceable to pt2
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "urm_ray"],
            metadata=tags,
        )
    client = _client(tracking_uri)
    version = info.registered_model_version
    for key, value in tags.items():
        client.set_model_version_tag(registered_name, str(version), key, value)
    return str(version)
