"""The training driver: trains (or resumes) one run from a RunConfig.

    result = fit(load_config("sudoku4-urm"))

The driver checks the config against the dataset and the cluster before any work, starts (or
joins) Ray, builds the host ``session.choose_host`` names and hands it to the run's session
(``session.Session``), which opens (or on resume re-opens) the MLflow run, holds its heartbeat,
and records how the run ended. Reusing ``train.run_name`` with the same ``checkpoint.storage_path``
resumes from the latest checkpoint, once ``resume`` has checked that the config changed only
where a resume may, and that no other driver trains the run now.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import ray

from urm_ray import tracking
from urm_ray.cluster import check_reachable, init_ray, scaled_up
from urm_ray.config import RunConfig
from urm_ray.data.store import DatasetMeta
from urm_ray.progress import Progress
from urm_ray.train import resume
from urm_ray.train.hosts import ProcessHost
from urm_ray.train.session import (PROCESS, TRIAL, FitResult, Here, InSweep, Runner, Session, alone, choose_host,
                                   prepare)
from urm_ray.train.workers import Workers, placed, worker_bundles

logger = logging.getLogger(__name__)


def fit(
    cfg: RunConfig,
    tags: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
    scale_up_s: float = 0.0,
    verbose: bool = False,
    progress: Progress | None = None,
    meta: DatasetMeta | None = None,
    sweep: InSweep | None = None,
) -> FitResult:
    """Train (or resume) one run; returns its final metrics and checkpoint path.

    ``tags`` and ``params`` are added to the MLflow run (a sweep passes the parent run id and the
    sampled values). ``scale_up_s`` > 0: first ask the autoscaler for the workers (GPUs unless
    ``resources.device=cpu``) and wait that long for them. Ray is started (or joined, with
    $RAY_ADDRESS) here unless the caller did; ``verbose`` shows its output.
    ``progress``: shows the steps while training and then the last phases (the final evaluation,
    the checkpoint saved and uploaded); its owner closes it once this returns (None: nothing is
    shown). ``meta``: the dataset's metadata when the caller read it (a sweep's driver, for its
    trials). ``sweep``: the run is a sweep's trial (``urm_ray.tune.trial_host.in_sweep``): Tune
    runs one attempt of it at a time and restores it after a failure, so it takes no lock and
    looks at no heartbeat.
    """
    cfg, meta = prepare(cfg, meta)
    where = choose_host(cfg, sweep is not None)
    with _claimed(cfg, where, sweep is not None, verbose, scale_up_s) as (previous, gpu):
        cfg, runner = _runner(cfg, where, sweep, gpu)
        return Session.open(cfg, meta, previous, tags, params, sweep).train(runner, progress)


@contextmanager
def _claimed(cfg: RunConfig, where: str, in_sweep: bool, verbose: bool,
             scale_up_s: float) -> Iterator[tuple[tracking.RunSummary | None, bool]]:
    """What a run needs before its session opens; the block's value is its MLflow record so far
    (None: a new run, or tracking off) and whether its workers get GPUs. A config a resume may
    train on and the run's lock outside a sweep (``resume``); Ray, started while the MLflow store
    opens and the record is read; with ``scale_up_s`` > 0 the workers' nodes, asked of the
    autoscaler for the block's length; then the workers placed (``workers.placed``). A trial in its
    Tune trial actor needs only the record: Ray is up and the sweep checked the cluster, the config
    and the trial's device."""
    if where != TRIAL:
        resume.check(cfg)
    with nullcontext() if in_sweep else resume.locked(cfg):
        run = (cfg.tracking.experiment, cfg.train.run_name)
        with (tracking.store_opening(cfg.tracking.tracking_uri, run) if cfg.tracking.enabled
              else nullcontext(lambda: None)) as previous:
            if not ray.is_initialized():  # a run that will train in this process needs no dashboard
                init_ray(verbose=verbose, dashboard=in_sweep or not alone(cfg))
        if where == TRIAL:
            yield previous(), False
            return
        # on a cluster of several nodes: no data or checkpoints on this node's disk
        check_reachable({"data.path": (cfg.data.path, "the dataset"),
                         "checkpoint.storage_path": (cfg.checkpoint.storage_path, "the checkpoints")},
                        cfg.resources.shared_fs, scale_up_s > 0)
        with scaled_up(worker_bundles(cfg), scale_up_s):
            yield previous(), placed(cfg)


def _runner(cfg: RunConfig, where: str, sweep: InSweep | None, gpu: bool) -> tuple[RunConfig, Runner]:
    """The runner ``where`` names, with the config it runs (a run given this machine: its threads)."""
    if where == TRIAL:  # one worker, in its Tune trial actor
        assert sweep is not None
        return cfg, Here(partial(sweep.host, device=cfg.resources.device), where)
    logger.info("starting %d Ray Train worker(s) (%s)%s for run %s", cfg.resources.num_workers,
                "GPU" if gpu else "CPU", " in this process" if where == PROCESS else "", cfg.train.run_name)
    if where != PROCESS:
        return cfg, Workers(gpu, [] if sweep is None else sweep.callbacks)
    if not cfg.resources.torch_threads:  # the run is given this machine (a private Ray instance)
        cfg = replace(cfg, resources=replace(cfg.resources, torch_threads=len(os.sched_getaffinity(0))))
    host = partial(ProcessHost, run_folder=Path(cfg.checkpoint.storage_path) / cfg.train.run_name,
                   keep=cfg.checkpoint.keep, device="cuda" if gpu else "cpu")
    return cfg, Here(host, where)
