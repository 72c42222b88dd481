"""Ray Train's workers for a run's loop: what they need of the cluster, and the ``TorchTrainer``.

The run's session (``session.Session.train``) runs ``Workers.run`` when ``choose_host`` says
WORKERS: a run of several workers, one with worker-group restarts, custom resources or remote
storage, a run on a cluster, or a sweep's trial of several workers.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import ray
import ray.train
import torch
from ray.train.torch import TorchConfig, TorchTrainer

from urm_ray.cluster import ray_train_defaults
from urm_ray.config import RunConfig
from urm_ray.data import stream
from urm_ray.errors import ConfigError
from urm_ray.progress import Progress
from urm_ray.train.live import watching
from urm_ray.train.loop import train_loop_per_worker
from urm_ray.train.session import WORKERS, Outcome, Session, datasets
from urm_ray.typed import to_dict

DATA_CPU_RESERVE = 0.5  # CPU kept free for Ray Data's read/augment tasks (else ingest starves)


def use_gpu(cfg: RunConfig) -> bool:
    if cfg.resources.device == "auto":
        return ray.cluster_resources().get("GPU", 0) > 0
    return cfg.resources.device == "cuda"


def check_resources(cfg: RunConfig, gpu: bool) -> None:
    """Fail at once, naming what is missing, when the workers cannot be placed."""
    total = ray.cluster_resources()
    need_cpu = cfg.resources.num_workers * cfg.resources.cpus_per_worker + DATA_CPU_RESERVE
    if need_cpu > total.get("CPU", 0):
        raise ConfigError(
            f"resources.num_workers={cfg.resources.num_workers} x resources.cpus_per_worker="
            f"{cfg.resources.cpus_per_worker} plus {DATA_CPU_RESERVE} CPU for Ray Data needs "
            f"{need_cpu} CPUs; the cluster has {total.get('CPU', 0)}"
        )
    for name, amount in cfg.resources.worker_resources.items():
        if cfg.resources.num_workers * amount > total.get(name, 0):
            raise ConfigError(
                f"resources.worker_resources.{name}={amount:g} x resources.num_workers={cfg.resources.num_workers}"
                f" needs {cfg.resources.num_workers * amount:g} {name}; the cluster has {total.get(name, 0):g}"
            )
    need_gpu = cfg.resources.num_workers * cfg.resources.gpus_per_worker if gpu else 0
    if need_gpu > total.get("GPU", 0):
        raise ConfigError(
            f"resources.device={cfg.resources.device} needs {need_gpu} GPUs "
            f"(resources.num_workers x resources.gpus_per_worker); the cluster has {total.get('GPU', 0)}"
        )


def placed(cfg: RunConfig) -> bool:
    """Whether the run's workers get GPUs, once the cluster is known to hold them
    (``check_resources``); on CPU, says which settings have no effect there."""
    gpu = use_gpu(cfg)
    check_resources(cfg, gpu)
    if not gpu:
        cfg.warn_unused_on_cpu(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return gpu


def worker_bundles(cfg: RunConfig) -> list[dict[str, float]]:
    """The run's workers (and Ray Data's CPU) as autoscaler bundles."""
    gpus = 0.0 if cfg.resources.device == "cpu" else cfg.resources.gpus_per_worker
    worker = {"CPU": cfg.resources.cpus_per_worker, "GPU": gpus, **cfg.resources.worker_resources}
    return [{"CPU": DATA_CPU_RESERVE}] + [dict(worker) for _ in range(cfg.resources.num_workers)]


@dataclass
class Workers:
    """The run's loop in Ray Train's workers. ``callbacks``: Ray Train ``UserCallback``s, e.g.
    Tune's report of a sweep's trial."""

    gpu: bool
    callbacks: list[Any]
    where: str = WORKERS

    def run(self, session: Session, progress: Progress | None) -> Outcome:
        with nullcontext(None) if progress is None else watching(progress) as inbox:
            result = build_trainer(session, self.gpu, self.callbacks, inbox).fit()
        return dict(result.metrics or {}), result.checkpoint


def build_trainer(session: Session, gpu: bool, callbacks: list[Any], inbox: Any = None) -> TorchTrainer:
    """Ray Train's workers for the loop; ``inbox``: where rank 0 sends its progress
    (``live.watching``), None: nowhere."""
    cfg, meta = session.cfg, session.meta
    resources = {"CPU": cfg.resources.cpus_per_worker, **cfg.resources.worker_resources}
    if gpu:
        resources["GPU"] = cfg.resources.gpus_per_worker
    ray_train_defaults()
    return TorchTrainer(
        train_loop_per_worker,
        # the metadata travels with the config: a worker on another node reads only the data files
        train_loop_config={"config": to_dict(cfg), "meta": meta, "run_id": session.run.id or "",
                           "tracking_uri": cfg.tracking.tracking_uri, "progress": inbox},
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.resources.num_workers, use_gpu=gpu,
                                               resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name=cfg.train.run_name,
            storage_path=cfg.checkpoint.storage_path,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
            failure_config=ray.train.FailureConfig(max_failures=cfg.resources.max_failures),
            callbacks=callbacks,
        ),
        datasets=datasets(cfg, meta),
        dataset_config=ray.train.DataConfig(execution_options=stream.ingest_options()),
    )
