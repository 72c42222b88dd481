"""The training driver: builds a Ray Train ``TorchTrainer`` from a RunConfig and runs it.

    result = fit(load_config("sudoku4-urm"))

The driver checks the config against the dataset and the cluster before any work, opens (or on
resume re-opens) the MLflow run and records the resolved config and the dataset in it, streams the
dataset with Ray Data, and after training uploads the final checkpoint to MLflow. Reusing
``train.run_name`` with the same ``train.storage_path`` resumes from the latest checkpoint, once
``resume`` has checked that the config changed only where a resume may, and that no other driver
trains the run now.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.fs
import ray
import ray.train
import torch
from ray.train import WorkerGroupError
from ray.train.torch import TorchConfig, TorchTrainer

from urm_ray import heartbeat, tracking
from urm_ray.cluster import check_reachable, init_ray, on_private_instance, ray_train_defaults, scaled_up
from urm_ray.config import RunConfig, dump_yaml, flatten
from urm_ray.data import builtin, store, stream
from urm_ray.data.store import DatasetMeta
from urm_ray.data.tasks import registry
from urm_ray.errors import ConfigError, DataError, Interrupted, TrainingDiverged, TrainingFailed
from urm_ray.objectives import objective_for
from urm_ray.outbox import one_line
from urm_ray.progress import Progress
from urm_ray.tracking import CHECKPOINT_TAG, FATE_TAG, KIND_TAG, REASON_TAG, make_tracker
from urm_ray.train import resume
from urm_ray.train.checkpoint import latest_local
from urm_ray.train.hosts import ProcessHost, TrialHost, TuneFilter
from urm_ray.train.live import Direct, Sender, watching
from urm_ray.train.loop import run_loop, train_loop_per_worker
from urm_ray.train.step import local_device
from urm_ray.typed import to_dict

logger = logging.getLogger(__name__)

DATA_CPU_RESERVE = 0.5  # CPU kept free for Ray Data's read/augment tasks (else ingest starves)


@dataclass
class FitResult:
    run_name: str
    metrics: dict[str, Any]
    checkpoint_path: str | None  # local folder or URI (s3://...)
    mlflow_run_id: str | None


def resolve(cfg: RunConfig) -> RunConfig:
    """Fill in what the driver decides: run name, absolute paths and tracking URI.

    Ray moves the working directory of workers, so every local path is made absolute here.
    """
    train = cfg.train
    name = train.run_name or f"{cfg.model.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    storage = train.storage_path
    if "://" not in storage:
        storage = str(Path(storage).resolve())
    uri = tracking.resolve_tracking_uri(cfg.tracking.tracking_uri)
    data_path = builtin.resolve_path(cfg.data.path)
    if "://" not in data_path:
        data_path = str(Path(data_path).resolve())
    return replace(
        cfg,
        data=replace(cfg.data, path=data_path),
        train=replace(train, run_name=name, storage_path=storage),
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
        raise ConfigError(f"train.storage_path={storage_path!r}: checkpoints cannot be written there "
                          f"({err}); expected a writable folder or s3://bucket/prefix") from err


def use_gpu(cfg: RunConfig) -> bool:
    if cfg.train.device == "auto":
        return ray.cluster_resources().get("GPU", 0) > 0
    return cfg.train.device == "cuda"


def check_resources(cfg: RunConfig, gpu: bool) -> None:
    """Fail at once, naming what is missing, when the workers cannot be placed."""
    total = ray.cluster_resources()
    need_cpu = cfg.train.num_workers * cfg.train.cpus_per_worker + DATA_CPU_RESERVE
    if need_cpu > total.get("CPU", 0):
        raise ConfigError(
            f"train.num_workers={cfg.train.num_workers} x train.cpus_per_worker="
            f"{cfg.train.cpus_per_worker} plus {DATA_CPU_RESERVE} CPU for Ray Data needs "
            f"{need_cpu} CPUs; the cluster has {total.get('CPU', 0)}"
        )
    for name, amount in cfg.train.worker_resources.items():
        if cfg.train.num_workers * amount > total.get(name, 0):
            raise ConfigError(
                f"train.worker_resources.{name}={amount:g} x train.num_workers={cfg.train.num_workers}"
                f" needs {cfg.train.num_workers * amount:g} {name}; the cluster has {total.get(name, 0):g}"
            )
    need_gpu = cfg.train.num_workers * cfg.train.gpus_per_worker if gpu else 0
    if need_gpu > total.get("GPU", 0):
        raise ConfigError(
            f"train.device={cfg.train.device} needs {need_gpu} GPUs "
            f"(train.num_workers x train.gpus_per_worker); the cluster has {total.get('GPU', 0)}"
        )


def runs_in_process(cfg: RunConfig) -> bool:
    """Where the loop of a run outside a sweep runs (``train.in_process``; auto: in this process
    when nothing else changes: one worker, no worker-group restarts, no custom worker resources,
    local storage, and Ray is this process's private local instance, one machine)."""
    if cfg.train.in_process == "auto":
        return _alone(cfg) and on_private_instance()
    return cfg.train.in_process


def _alone(cfg: RunConfig) -> bool:
    return (cfg.train.num_workers == 1 and not cfg.train.max_failures
            and not cfg.train.worker_resources and "://" not in cfg.train.storage_path)


def datasets(cfg: RunConfig, meta: DatasetMeta) -> dict[str, Any]:
    """The run's Ray Datasets: "train" (augmented on the fly) and "eval" (held-out originals)."""
    eval_ds = stream.eval_dataset(cfg.data, meta)
    if cfg.train.eval_max_rows:
        eval_ds = eval_ds.limit(cfg.train.eval_max_rows)
    return {"train": stream.train_dataset(cfg.data, meta), "eval": eval_ds}


def check_nodes(cfg: RunConfig, grows: bool = False) -> None:
    """On a cluster of several nodes, refuse data or checkpoints on this node's disk
    (``cluster.check_reachable``)."""
    check_reachable({"data.path": (cfg.data.path, "the dataset"),
                     "train.storage_path": (cfg.train.storage_path, "the checkpoints")},
                    cfg.train.shared_fs, grows)


def build_trainer(cfg: RunConfig, meta: DatasetMeta, run_id: str | None, gpu: bool,
                  callbacks: list[Any] | None = None, inbox: Any = None) -> TorchTrainer:
    """Ray Train's workers for the loop. ``callbacks``: Ray Train ``UserCallback``s, e.g. Tune's
    ``TuneReportCallback`` in a sweep; ``inbox``: where rank 0 sends its progress
    (``live.watching``), None: nowhere."""
    resources = {"CPU": cfg.train.cpus_per_worker, **cfg.train.worker_resources}
    if gpu:
        resources["GPU"] = cfg.train.gpus_per_worker
    ray_train_defaults()
    return TorchTrainer(
        train_loop_per_worker,
        # the metadata travels with the config: a worker on another node reads only the data files
        train_loop_config={"config": to_dict(cfg), "meta": meta, "run_id": run_id or "",
                           "tracking_uri": cfg.tracking.tracking_uri, "progress": inbox},
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.train.num_workers, use_gpu=gpu,
                                               resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=cfg.train.run_name,
            storage_path=cfg.train.storage_path,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=cfg.train.max_failures),
            callbacks=callbacks or [],
        ),
        datasets=datasets(cfg, meta),
        # only "train" is split: Ray's equal split drops the rows that do not divide by the
        # worker count, so each rank reads all of "eval" and scores its share (`Loop._evaluate`)
        dataset_config=ray.train.DataConfig(datasets_to_split=["train"],
                                            execution_options=stream.ingest_options()),
    )


def prepare(cfg: RunConfig, meta: DatasetMeta | None = None) -> tuple[RunConfig, DatasetMeta]:
    """The resolved config and its dataset's metadata, every check that needs no Ray done: a
    missing or malformed dataset, a verifier or search the task lacks, unwritable storage.
    ``meta``: the metadata a sweep's driver read once for all its trials (None: read it here)."""
    logger.info("reading data %s", cfg.data.path)  # a builtin: dataset is built on first use
    cfg = resolve(cfg)
    meta = meta or stream.load_meta(cfg.data)
    stream.warn_unused(cfg.data, meta)
    task = registry.of(meta)
    cfg.eval.own_views(task, stream.augmentation_slots(cfg.data))  # views beyond the puzzle table
    if cfg.eval.views and task.scoring is None and not cfg.train.eval_curves:
        warnings.warn(f"eval.views=true has no effect on {meta.task} data without train.eval_curves: the "
                      "task has no score of its own voted over views", stacklevel=3)
    if cfg.train.eval_curves:
        cfg.eval.check_task(task)
    logger.info("data: %s", ", ".join(f"{name} {split.num_rows} rows"
                                      for name, split in meta.splits.items()))
    objective_for(cfg, meta)
    check_storage(cfg.train.storage_path)
    return cfg, meta


def fit(
    cfg: RunConfig,
    tags: dict[str, str] | None = None,
    callbacks: list[Any] | None = None,
    params: dict[str, Any] | None = None,
    scale_up_s: float = 0.0,
    verbose: bool = False,
    progress: Progress | None = None,
    meta: DatasetMeta | None = None,
) -> FitResult:
    """Train (or resume) one run; returns its final metrics and checkpoint path.

    ``tags`` and ``params`` are added to the MLflow run (a sweep passes the parent run id and the
    sampled values); ``callbacks`` go to Ray Train's ``RunConfig`` (a sweep's trial on several
    workers), and put the loop in Ray Train's workers. ``scale_up_s`` > 0: first ask the
    autoscaler for the workers (GPUs unless ``train.device=cpu``) and wait that long for them.
    Ray is started (or joined, with $RAY_ADDRESS) here unless the caller did; ``verbose`` shows
    its output. ``progress``: shows the steps while training and then the last phases (the final
    evaluation, the checkpoint saved and uploaded); its owner closes it once this returns (None:
    nothing is shown). The setup phases are logged at INFO. ``meta``: the dataset's metadata when
    the caller read it (a sweep's driver, for its trials).
    """
    cfg, meta = prepare(cfg, meta)
    resume.check(cfg)
    # Tune runs one attempt of a trial at a time and restores it after a failure: no lock, no heartbeat look
    in_tune = (tags or {}).get(KIND_TAG) in ("trial", "seed")
    with nullcontext() if in_tune else resume.locked(cfg):
        with tracking.store_opening(cfg.tracking.tracking_uri) if cfg.tracking.enabled else nullcontext():
            if not ray.is_initialized():  # a run that will train in this process needs no dashboard
                init_ray(verbose=verbose, dashboard=bool(callbacks) or not _alone(cfg))
        check_nodes(cfg, grows=scale_up_s > 0)
        if not in_tune:
            resume.refuse_if_beating(cfg)  # the store opened alongside Ray: no wait of its own
        with scaled_up(worker_bundles(cfg), scale_up_s):
            return _fit(cfg, meta, tags, callbacks, params, progress)


def worker_bundles(cfg: RunConfig) -> list[dict[str, float]]:
    """The run's workers (and Ray Data's CPU) as autoscaler bundles."""
    gpus = 0.0 if cfg.train.device == "cpu" else cfg.train.gpus_per_worker
    worker = {"CPU": cfg.train.cpus_per_worker, "GPU": gpus, **cfg.train.worker_resources}
    return [{"CPU": DATA_CPU_RESERVE}] + [dict(worker) for _ in range(cfg.train.num_workers)]


def _fit(cfg: RunConfig, meta: DatasetMeta, tags: dict[str, str] | None,
         callbacks: list[Any] | None, params: dict[str, Any] | None,
         progress: Progress | None) -> FitResult:
    gpu = use_gpu(cfg)
    if not gpu:
        cfg.train.warn_unused_on_cpu(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    check_resources(cfg, gpu)
    here = not callbacks and runs_in_process(cfg)
    if here and not cfg.train.torch_threads:  # the run is given this machine (a private Ray instance)
        cfg = replace(cfg, train=replace(cfg.train, torch_threads=len(os.sched_getaffinity(0))))
    run_id = open_mlflow_run(cfg, meta, tags, params)
    logger.info("starting %d Ray Train worker(s) (%s)%s for run %s", cfg.train.num_workers,
                "GPU" if gpu else "CPU", " in this process" if here else "", cfg.train.run_name)
    try:
        with _noting_sigint() as interrupted, heartbeat.beating(cfg.tracking.tracking_uri, run_id):
            if here:
                metrics, ckpt = _train_here(cfg, meta, run_id, gpu, progress)
            else:
                with _watched(progress) as inbox:
                    result = build_trainer(cfg, meta, run_id, gpu, callbacks, inbox).fit()
                metrics, ckpt = dict(result.metrics or {}), result.checkpoint
    except BaseException as err:
        diverged = _record_failure(cfg, run_id, err, interrupted())
        if diverged is not None:  # the reason in one line, not Ray's worker traceback
            raise diverged from None
        if interrupted() or isinstance(err, KeyboardInterrupt):  # Ray Train aborted on Ctrl-C
            raise Interrupted() from None  # the resume hint is logged: no traceback under it
        if isinstance(err, WorkerGroupError) and err.worker_failures:
            raise TrainingFailed.from_workers(err.worker_failures) from None
        if here and isinstance(err, Exception) and not isinstance(err, (ConfigError, DataError)):
            raise TrainingFailed.from_workers({0: err}) from err  # as a worker's failure reads
        raise
    if run_id:
        _finish_mlflow(cfg, run_id, ckpt, progress)
    return FitResult(cfg.train.run_name, metrics, checkpoint_uri(ckpt), run_id)


def _train_here(cfg: RunConfig, meta: DatasetMeta, run_id: str | None, gpu: bool,
                progress: Progress | None) -> tuple[dict[str, Any], ray.train.Checkpoint | None]:
    """The loop in this process; returns the metrics reported with the last checkpoint, and it."""
    host = ProcessHost(datasets(cfg, meta), Path(cfg.train.storage_path) / cfg.train.run_name,
                       cfg.train.keep_checkpoints)
    device = local_device("cuda" if gpu else "cpu")
    sender = Sender(None if progress is None else Direct(progress))
    run_loop(cfg, meta, host, device, make_tracker(cfg.tracking.tracking_uri, run_id or "", True), sender)
    return host.metrics, None if host.latest is None else ray.train.Checkpoint(str(host.latest))


def fit_in_trial(cfg: RunConfig, tags: dict[str, str], params: dict[str, Any], to_tune: TuneFilter,
                 meta: DatasetMeta | None = None) -> None:
    """A sweep's one-worker trial, trained in its Tune trial actor through the same loop: it
    reports to Tune and checkpoints through ``tune.report`` (to the sweep's Tune storage); Tune
    retries and resumes it. ``meta``: as for ``fit``."""
    cfg, meta = prepare(cfg, meta)
    run_id = open_mlflow_run(cfg, meta, tags, params)
    host = TrialHost(datasets(cfg, meta), to_tune)
    device = local_device(cfg.train.device)
    try:
        with heartbeat.beating(cfg.tracking.tracking_uri, run_id):
            run_loop(cfg, meta, host, device, make_tracker(cfg.tracking.tracking_uri, run_id or "", True))
    except BaseException as err:
        diverged = _record_failure(cfg, run_id, err, interrupted=False)
        if diverged is not None:
            raise diverged from None
        raise
    if run_id:
        _finish_mlflow(cfg, run_id, host.latest(), None)


def _watched(progress: Progress | None) -> Any:
    """``live.watching(progress)``, or no inbox at all when nobody watches."""
    return nullcontext(None) if progress is None else watching(progress)


def _record_failure(cfg: RunConfig, run_id: str | None, err: BaseException,
                    interrupted: bool) -> TrainingDiverged | None:
    """Close the MLflow run (KILLED after Ctrl-C, else FAILED, with the reason when training
    diverged), say how to resume from the latest checkpoint, and return the divergence if any."""
    diverged = TrainingDiverged.find(err)
    stopped = interrupted or isinstance(err, KeyboardInterrupt)
    # A sweep's trial stopped by its scheduler is interrupted too, after the sweep recorded its
    # fate (pruned, KILLED): that record stands.
    try:
        decided = run_id and FATE_TAG in tracking.run_summary(cfg.tracking.tracking_uri, run_id).tags
        if run_id and not decided:
            if diverged is not None:
                tracking.set_tags(cfg.tracking.tracking_uri, run_id,
                                  {FATE_TAG: "failed", REASON_TAG: str(diverged)})
            tracking.close_run(cfg.tracking.tracking_uri, run_id, "KILLED" if stopped else "FAILED")
    except Exception as unrecorded:  # noqa: BLE001 (a tracking store away: the run's error comes first)
        logger.warning("MLflow run %s not closed as %s: %s", run_id, "KILLED" if stopped else "FAILED",
                       one_line(unrecorded))
    local = "://" not in cfg.train.storage_path
    latest = latest_local(Path(cfg.train.storage_path) / cfg.train.run_name) if local else None
    if diverged is None and latest is not None:
        logger.warning("run %s stopped; its latest checkpoint is %s: rerun with train.run_name=%s to "
                       "resume there (train.max_failures=N retries a crashed worker group by itself)",
                       cfg.train.run_name, latest, cfg.train.run_name)
    return diverged


@contextmanager
def _noting_sigint() -> Iterator[Callable[[], bool]]:
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


def open_mlflow_run(cfg: RunConfig, meta: DatasetMeta, tags: dict[str, str] | None = None,
                    params: dict[str, Any] | None = None) -> str | None:
    """Open (or re-open) the MLflow run of a resolved config, with its params, and record before
    any training what a run that then crashes must still show: ``config.yaml`` and the dataset."""
    if not cfg.tracking.enabled:
        return None
    uri = cfg.tracking.tracking_uri
    heartbeat.warn_if_lost(uri, cfg.tracking.experiment, cfg.train.run_name)
    run_id = tracking.open_run(uri, cfg.tracking.experiment, cfg.train.run_name,
                               {**flatten(cfg), **(params or {})}, tags)
    resume.record(uri, run_id, cfg)
    logger.info("MLflow run %s in experiment %r (%s)", run_id, cfg.tracking.experiment, uri)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(dump_yaml(cfg))
        tracking.log_artifact(uri, run_id, path)
    splits = {name: split.num_rows for name, split in meta.splits.items()}
    profile = {"task": meta.task, "seq_len": meta.seq_len, "vocab_size": meta.vocab_size,
               "num_rows": splits}
    tracking.log_dataset(uri, run_id, Path(cfg.data.path).name, cfg.data.path,
                         store.metadata_digest(meta), profile)
    return run_id


def _finish_mlflow(cfg: RunConfig, run_id: str, ckpt: ray.train.Checkpoint | None,
                   progress: Progress | None) -> None:
    """The trained run's last records, each tried again while the tracking store is away
    (``tracking.retried``): training is over and its checkpoint saved, so only a store still
    away after ``tracking.FLUSH_LIMIT_S`` fails the command."""
    uri = cfg.tracking.tracking_uri
    if ckpt is not None:
        tracking.retried("the checkpoint tag", lambda: tracking.set_tags(
            uri, run_id, {CHECKPOINT_TAG: checkpoint_uri(ckpt)}))  # for `urm-ray runs`
    if ckpt is not None and cfg.tracking.log_checkpoint:
        logger.info("uploading the checkpoint to MLflow")
        if progress is not None:
            progress.phase("uploading the checkpoint to MLflow")
        with ckpt.as_directory() as folder:
            tracking.retried("the checkpoint's upload to MLflow", lambda: tracking.log_artifact(
                uri, run_id, folder, "checkpoint"))
    tracking.retried("closing the MLflow run", lambda: tracking.close_run(uri, run_id, "FINISHED"))
