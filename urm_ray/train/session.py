"""A run's life, written once, for every entry point that trains (``urm-ray train``, a sweep's
trial, ``final`` and its re-checks).

    cfg, meta = prepare(cfg)                           # resolved, every check that needs no Ray
    where = choose_host(cfg, in_sweep=False)           # PROCESS, WORKERS or TRIAL
    session = Session.open(cfg, meta, previous, tags, params)  # the MLflow run (``previous``: its
                                                               # record so far), opened once
    result = session.train(Here(make_host, where), progress)  # or Ray Train's ``workers.Workers``

``Session.train`` holds the heartbeat while the loop runs, records a failure (FAILED, KILLED
after Ctrl-C, the reason of a divergence) unless the sweep already recorded how the run ended,
says how to resume, and records a finished run's checkpoint. Where the loop runs is chosen in
``choose_host`` alone; the driver builds the runner it names, which builds the run's datasets when
the loop starts (``Here`` with a host of ``hosts``, ``workers.Workers``, and for a
sweep's trial ``urm_ray.tune.trial_host``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import pyarrow
import pyarrow.fs
import ray.train
from ray.train import WorkerGroupError

from urm_ray import heartbeat, tracking
from urm_ray.cluster import on_private_instance
from urm_ray.config import RunConfig, dump_yaml, flatten, resolve_tracking_uri
from urm_ray.data import builtin, store, stream
from urm_ray.data.store import DatasetMeta
from urm_ray.data.tasks import registry
from urm_ray.errors import ConfigError, DataError, Interrupted, TrainingDiverged, TrainingFailed
from urm_ray.objectives import objective_for
from urm_ray.outbox import one_line
from urm_ray.progress import Progress
from urm_ray.train import resume
from urm_ray.train.checkpoint import latest_local
from urm_ray.train.hosts import Host
from urm_ray.train.live import Direct, Sender
from urm_ray.train.loop import run_loop

logger = logging.getLogger(__name__)

PROCESS, WORKERS, TRIAL = "process", "workers", "trial"  # where a run's loop runs (``choose_host``)
Outcome = tuple[dict[str, Any], ray.train.Checkpoint | None]  # final metrics, final checkpoint


@dataclass
class FitResult:
    run_name: str
    metrics: dict[str, Any]
    checkpoint_path: str | None  # local folder or URI (s3://...)
    mlflow_run_id: str | None


@dataclass
class InSweep:
    """What a sweep's trial adds to its run (``urm_ray.tune.trial_host.in_sweep``)."""

    host: Callable[[dict[str, Any], str], Host]  # (datasets, resources.device) -> a one-worker trial's host
    callbacks: list[Any]  # Ray Train callbacks of a trial on several workers: its reports to Tune
    ended: Callable[[dict[str, str]], bool]  # whether the run's tags already record how it ended


def choose_host(cfg: RunConfig, in_sweep: bool) -> str:
    """Where the loop of a (resolved) run runs: a sweep's one-worker trial in its Tune trial actor
    (TRIAL), a run of several workers in Ray Train's (WORKERS), any other in this process when
    ``runs_in_process`` says so (PROCESS)."""
    if in_sweep:
        return TRIAL if cfg.resources.num_workers == 1 else WORKERS
    return PROCESS if runs_in_process(cfg) else WORKERS


def runs_in_process(cfg: RunConfig) -> bool:
    """Where the loop of a run outside a sweep runs (``resources.in_process``; auto: in this process
    when nothing else changes: one worker, no worker-group restarts, no custom worker resources,
    local storage, and Ray is this process's private local instance, one machine)."""
    if cfg.resources.in_process == "auto":
        return alone(cfg) and on_private_instance()
    return cfg.resources.in_process


def alone(cfg: RunConfig) -> bool:
    return (cfg.resources.num_workers == 1 and not cfg.resources.max_failures
            and not cfg.resources.worker_resources and "://" not in cfg.checkpoint.storage_path)


def resolve(cfg: RunConfig) -> RunConfig:
    """Fill in what the driver decides: run name, absolute paths and tracking URI.

    Ray moves the working directory of workers, so every local path is made absolute here.
    """
    train = cfg.train
    name = train.run_name or f"{cfg.model.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    storage = cfg.checkpoint.storage_path
    if "://" not in storage:
        storage = str(Path(storage).resolve())
    uri = resolve_tracking_uri(cfg.tracking.tracking_uri)
    data_path = builtin.resolve_path(cfg.data.path)
    if "://" not in data_path:
        data_path = str(Path(data_path).resolve())
    return replace(
        cfg,
        data=replace(cfg.data, path=data_path),
        train=replace(train, run_name=name),
        checkpoint=replace(cfg.checkpoint, storage_path=storage),
        tracking=replace(cfg.tracking, tracking_uri=uri),
    )


def check_storage(storage_path: str) -> None:
    """Fail before Ray starts when checkpoints cannot be written there: one small write and delete
    (a local folder, created if missing, or s3://bucket/prefix)."""
    probe = f".urm_ray_write_probe_{uuid.uuid4().hex}"
    try:
        if "://" in storage_path:
            fs, root = pyarrow.fs.FileSystem.from_uri(storage_path)
        else:
            fs, root = pyarrow.fs.LocalFileSystem(), storage_path
        fs.create_dir(root, recursive=True)
        path = f"{root.rstrip('/')}/{probe}"
        with fs.open_output_stream(path) as out:
            out.write(b"urm_ray")
        fs.delete_file(path)
    except (OSError, pyarrow.ArrowException) as err:
        raise ConfigError(f"checkpoint.storage_path={storage_path!r}: checkpoints cannot be written there "
                          f"({err}); expected a writable folder or s3://bucket/prefix") from err


def prepare(cfg: RunConfig, meta: DatasetMeta | None = None) -> tuple[RunConfig, DatasetMeta]:
    """The resolved config and its dataset's metadata, every check that needs no Ray done: a
    missing or malformed dataset, a verifier or search the task lacks, unwritable storage.
    ``meta``: the metadata a sweep's driver read once for all its trials (None: read it here)."""
    logger.info("reading data %s", cfg.data.path)  # a builtin: dataset is built on first use
    cfg = resolve(cfg)
    meta = meta or stream.load_meta(cfg.data)
    stream.warn_unused(cfg.data, meta)
    task = registry.of(meta)
    cfg.eval.own_views(task, cfg.data.augmentation_slots())  # views beyond the puzzle table
    if cfg.eval.views and task.scoring is None and not cfg.eval.curves:
        warnings.warn(f"eval.views=true has no effect on {meta.task} data without eval.curves: the "
                      "task has no score of its own voted over views", stacklevel=3)
    if cfg.eval.curves:
        cfg.eval.check_task(task)
    logger.info("data: %s", ", ".join(f"{name} {split.num_rows} rows"
                                      for name, split in meta.splits.items()))
    objective_for(cfg, meta)
    check_storage(cfg.checkpoint.storage_path)
    return cfg, meta


def datasets(cfg: RunConfig, meta: DatasetMeta) -> dict[str, Any]:
    """The run's Ray Datasets: "train", augmented on the fly (each evaluating rank reads the
    held-out originals itself: ``data.originals``)."""
    return {"train": stream.train_dataset(cfg.data, meta)}


def open_run(cfg: RunConfig, meta: DatasetMeta, previous: tracking.RunSummary | None,
             tags: dict[str, str] | None = None, params: dict[str, Any] | None = None,
             in_sweep: bool = False) -> tracking.Run | tracking.NullRun:
    """Open the MLflow run of a resolved config with its params, or reopen ``previous`` (what it
    recorded so far) once ``heartbeat.check_reopen`` allows it, and record before any training
    what a run that then crashes must still show: ``config.yaml`` and the dataset."""
    if not cfg.tracking.enabled:
        return tracking.NullRun()
    values, config = flatten(cfg), dump_yaml(cfg)
    profile = {"task": meta.task, "seq_len": meta.seq_len, "vocab_size": meta.vocab_size,
               "num_rows": {name: split.num_rows for name, split in meta.splits.items()}}
    digest = store.metadata_digest(meta)
    uri, experiment = cfg.tracking.tracking_uri, cfg.tracking.experiment
    heartbeat.check_reopen(previous, in_sweep)
    driver_tags, stale = resume.resumed_tags(previous, values)
    run = tracking.Run.open(uri, experiment, cfg.train.run_name, {**values, **(params or {})}, tags)
    run.set_tags(driver_tags)
    if stale:
        run.delete_tags(stale)
    run.log_config(config)
    run.log_dataset(Path(cfg.data.path).name, cfg.data.path, digest, profile)
    logger.info("MLflow run %s in experiment %r (%s)", run.id, experiment, uri)
    return run


def _never(tags: dict[str, str]) -> bool:
    return False


class Session:
    """One run: its resolved config, dataset, MLflow run (or ``NullRun``), and how its end is
    recorded. ``ended``: whether the run's tags already record how it ended (a sweep's fate)."""

    def __init__(self, cfg: RunConfig, meta: DatasetMeta, run: tracking.Run | tracking.NullRun,
                 ended: Callable[[dict[str, str]], bool] = _never) -> None:
        self.cfg, self.meta, self.run, self.ended = cfg, meta, run, ended

    @classmethod
    def open(cls, cfg: RunConfig, meta: DatasetMeta, previous: tracking.RunSummary | None,
             tags: dict[str, str] | None = None, params: dict[str, Any] | None = None,
             sweep: InSweep | None = None) -> Session:
        """The session of a run whose MLflow record so far is ``previous`` (None: a new run)."""
        return cls(cfg, meta, open_run(cfg, meta, previous, tags, params, sweep is not None),
                   _never if sweep is None else sweep.ended)

    def train(self, runner: Runner, progress: Progress | None = None) -> FitResult:
        """Run the loop where ``runner`` runs it, under the run's heartbeat; record its failure or
        its checkpoint."""
        try:
            with noting_sigint() as interrupted, heartbeat.beating(self.run):
                metrics, ckpt = runner.run(self, progress)
        except BaseException as err:
            replaced, cause = self._failed(err, interrupted(), runner.where)
            if replaced is None:
                raise
            raise replaced from cause
        self._finish(ckpt, progress)
        return FitResult(self.cfg.train.run_name, metrics, checkpoint_uri(ckpt), self.run.id)

    def _failed(self, err: BaseException, interrupted: bool,
                where: str) -> tuple[BaseException | None, BaseException | None]:
        """The error the caller sees instead of ``err`` (None: ``err`` itself) and its cause."""
        diverged = self._record_failure(err, interrupted)
        if diverged is not None:  # the reason in one line, not Ray's worker traceback
            return diverged, None
        if where != TRIAL and (interrupted or isinstance(err, KeyboardInterrupt)):
            return Interrupted(), None  # the resume hint is logged: no traceback under it
        if isinstance(err, WorkerGroupError) and err.worker_failures:
            return TrainingFailed.from_workers(err.worker_failures), None
        if where == PROCESS and isinstance(err, Exception) and not isinstance(err, (ConfigError, DataError)):
            return TrainingFailed.from_workers({0: err}), err  # as a worker's failure reads
        return None, None

    def _record_failure(self, err: BaseException, interrupted: bool) -> TrainingDiverged | None:
        """Close the MLflow run (KILLED after Ctrl-C, else FAILED, with the reason when training
        diverged) unless its end is recorded already, say how to resume from the latest
        checkpoint, and return the divergence if any."""
        diverged = TrainingDiverged.find(err)
        status = "KILLED" if interrupted or isinstance(err, KeyboardInterrupt) else "FAILED"
        try:
            if not self.ended(self.run.tags()):
                self.run.fail(status, None if diverged is None else str(diverged))
        except Exception as unrecorded:  # noqa: BLE001 (a tracking store away: the run's error comes first)
            logger.warning("MLflow run %s not closed as %s: %s", self.run.id, status, one_line(unrecorded))
        name, storage = self.cfg.train.run_name, self.cfg.checkpoint.storage_path
        latest = latest_local(Path(storage) / name) if "://" not in storage else None
        if diverged is None and latest is not None:
            logger.warning("run %s stopped; its latest checkpoint is %s: rerun with train.run_name=%s to "
                           "resume there (resources.max_failures=N retries a crashed worker group by itself)",
                           name, latest, name)
        return diverged

    def _finish(self, ckpt: ray.train.Checkpoint | None, progress: Progress | None) -> None:
        """The run's last records (``tracking.Run.finish``): its checkpoint, uploaded when
        ``tracking.log_checkpoint``."""
        if not self.run:
            return
        if ckpt is None or not self.cfg.tracking.log_checkpoint:
            self.run.finish(checkpoint_uri(ckpt))
            return
        logger.info("uploading the checkpoint to MLflow")
        if progress is not None:
            progress.phase("uploading the checkpoint to MLflow")
        with ckpt.as_directory() as folder:
            self.run.finish(checkpoint_uri(ckpt), Path(folder))


class Runner(Protocol):
    """Where a run's loop runs, as ``choose_host`` named it: this process (``Here``) or Ray
    Train's workers (``workers.Workers``)."""

    where: str  # PROCESS, WORKERS or TRIAL

    def run(self, session: Session, progress: Progress | None) -> Outcome:
        """Run the session's loop to its end; what it reported with its last checkpoint."""


@dataclass
class Here:
    """The loop in this process: the command's own (PROCESS) or a sweep's Tune trial actor
    (TRIAL), on the host ``host`` builds around the run's datasets."""

    host: Callable[[dict[str, Any]], Host]
    where: str

    def run(self, session: Session, progress: Progress | None) -> Outcome:
        host = self.host(datasets(session.cfg, session.meta))
        sender = Sender(None if progress is None else Direct(progress))
        run_loop(session.cfg, session.meta, host, host.device(), session.run.tracker(True), sender)
        return host.reported(), host.latest()


@contextmanager
def noting_sigint() -> Iterator[Callable[[], bool]]:
    """Yields ``interrupted()``: whether Ctrl-C (SIGINT) arrived inside the block. Ray Train
    installs its own SIGINT handler during ``fit`` (it aborts the run and fit then raises a
    RayActorError), so the signal is noted below the handlers, by the interpreter's wakeup fd."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main one
        yield lambda: False
        return
    read, write = os.pipe()
    for fd in (read, write):
        os.set_blocking(fd, False)
    previous = signal.set_wakeup_fd(write)
    seen: list[int] = []
    open_fds = [read, write]

    def interrupted() -> bool:
        if open_fds:
            try:
                seen.extend(os.read(read, 4096))
            except BlockingIOError:  # nothing arrived
                pass
        return signal.SIGINT in seen

    try:
        yield interrupted
    finally:
        interrupted()
        signal.set_wakeup_fd(previous)
        while open_fds:
            os.close(open_fds.pop())


def checkpoint_uri(ckpt: ray.train.Checkpoint | None) -> str | None:
    """A local folder, or ``s3://bucket/...`` for a checkpoint on remote storage."""
    if ckpt is None:
        return None
    scheme = ckpt.filesystem.type_name  # "local", "s3", "gcs", ...
    return ckpt.path if scheme == "local" else f"{scheme}://{ckpt.path}"
