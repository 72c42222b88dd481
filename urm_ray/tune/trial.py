"""The Tune trainable of a sweep: one trial = one training run.

Tune calls ``run_trial(config, ctx)`` with the sampled values and the Optuna trial number. A
one-worker trial trains in its Tune trial actor, through the same loop as every run: it reports
to Tune and checkpoints with ``tune.report`` and resumes from ``tune.get_checkpoint()``. A trial
of several workers runs the Train driver (Ray Train's worker actors) and resumes its Train
checkpoint. Either way the MLflow run is named ``<sweep>-t<number>``, so a trial that is started
again after an interruption logs into the same nested run; a trial whose MLflow run already
records its fate is not trained again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from dataclasses import dataclass, replace
from typing import Any

import ray.tune

from urm_ray import redact, tracking
from urm_ray.data.store import DatasetMeta
from urm_ray.tracking import FATE_TAG, KIND_TAG, REASON_TAG, SWEEP_TAG, TRIAL_TAG
from urm_ray.tune.cost import measured
from urm_ray.tune.derived import Derived, DerivedReport
from urm_ray.tune.search import TRIAL_KEY
from urm_ray.tune.space import SearchSpace

STEP_TAG = "urm_ray.fate_step"  # the training step the trial stopped at
INTERRUPTED = "interrupted"  # the fate of a trial the sweep's Ctrl-C stopped, until a resume
# How long a reused trial actor waits for its stopped trial to finish before the next one starts
# (Tune's default: 2 s). A trial stopped by its scheduler closes its MLflow run on the way out;
# a loaded tracking database can take longer than 2 s, and Tune then fails the next trial
# ("Could not re-use actor").
STOPPED_TRIAL_WAIT_S = 120


@dataclass(frozen=True)
class TrialContext:
    """What every trial of a sweep shares (pickled into each trial actor)."""

    sweep: str
    space: SearchSpace
    extra: dict[str, Any]  # dotted keys set by the sweep: resources, storage, tracking
    tracking_uri: str
    experiment: str
    parent_run_id: str
    # the dataset's metadata, read once by the sweep's driver: a trial on another node reads only
    # the data files (None: each trial reads it)
    meta: DatasetMeta | None = None

    def without_secrets(self) -> TrialContext:
        """This context as it may be saved to disk (``redact.strip``)."""
        return replace(self, extra=redact.strip(self.extra), tracking_uri=redact.strip(self.tracking_uri))

    def with_secrets(self) -> TrialContext:
        """A saved context with the secrets this process remembers (``redact.recall``)."""
        extra = {k: redact.recall(v) if isinstance(v, str) else v for k, v in self.extra.items()}
        return replace(self, extra=extra, tracking_uri=redact.recall(self.tracking_uri))


def trial_run_name(sweep: str, number: int) -> str:
    return f"{sweep}-t{number:03d}"


def split_config(config: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(Optuna trial number, sampled values) from a Tune trial config."""
    return int(config[TRIAL_KEY]), {k: v for k, v in config.items() if k != TRIAL_KEY}


def allow_slow_stops() -> None:
    """Let this trial actor wait ``STOPPED_TRIAL_WAIT_S`` for a stopped trial's clean-up (Tune reads
    the setting in the actor when it reuses it for the next trial), unless the user set it."""
    os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", str(STOPPED_TRIAL_WAIT_S))


def run_trial(config: dict[str, Any], ctx: TrialContext) -> None:
    allow_slow_stops()
    # the trial holds its workers' devices from here on, also while it imports and loads data
    workers = int(ctx.extra.get("resources.num_workers", ctx.space.base_config.resources.num_workers))
    name = trial_run_name(ctx.sweep, split_config(config)[0])
    try:
        with measured(ctx.tracking_uri, ctx.experiment, name, workers):
            _run_trial(config, ctx)
    finally:
        release_memory()


def release_memory() -> None:
    """Hand what the finished trial freed back to the system. A reused trial actor runs dozens of
    trials; glibc keeps each trial's freed heap unless asked, so the actor's resident memory climbs
    faster from trial to trial without this (docs/sweeps-at-scale.md). Elsewhere (another libc,
    another system) only the collection runs.

    What survives the collection (the imported modules, the actor's own state) is frozen out of
    later collections: a full collection of a heap that holds torch, Ray and MLflow is slow, and
    would run once per trial, while the objects a trial leaves behind are few."""
    gc.collect()
    gc.freeze()
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _run_trial(config: dict[str, Any], ctx: TrialContext) -> None:
    from urm_ray.train.driver import fit  # the driver imports torch; keep this module light
    from urm_ray.tune.trial_host import in_sweep

    number, values = split_config(config)
    name = trial_run_name(ctx.sweep, number)
    derived = Derived.of(ctx.space, values)
    if _replay_finished(ctx, name, derived):
        return
    cfg = ctx.space.trial_config(values, {**ctx.extra, "train.run_name": name})
    tags = {tracking.PARENT_TAG: ctx.parent_run_id, SWEEP_TAG: ctx.sweep, TRIAL_TAG: str(number),
            KIND_TAG: "trial"}
    params = {f"sampled.{key}": value for key, value in values.items()}
    if ctx.space.evaluates:
        _evaluate(ctx, cfg, name, tags, params, derived)
        return
    # Tune's report callback for Ray Train's workers starts a queue actor (a process) of its own:
    # a one-worker trial trains in the trial actor and reports without it.
    several = cfg.resources.num_workers > 1
    if not several:
        forget_compiled_graphs(cfg)
    result = fit(cfg, tags=tags, params=params, meta=ctx.meta,
                 sweep=in_sweep(derived.for_tune, [DerivedReport(derived)] if several else []))
    if several and result.metrics.get("step") == cfg.train.steps:
        # A run resumed after its last step reports nothing itself: hand Tune its final result.
        ray.tune.report(derived.add(result.metrics))


def forget_compiled_graphs(cfg: Any) -> None:
    """Before a trial trains in this (reused) actor: with ``train.compile`` on, drop the graphs the
    actor's earlier trials compiled. Dynamo never frees them, and they count towards its recompile
    limit, which raises once it is hit (``train.compiled``)."""
    if cfg.train.compile is not False:
        from urm_ray.train.compiled import reset_compiled  # imports torch; keep this module light

        reset_compiled()


def _evaluate(ctx: TrialContext, cfg: Any, name: str, tags: dict[str, str], params: dict[str, Any],
              derived: Derived) -> None:
    """An evaluation sweep's trial: the sweep's checkpoint under the sampled ``eval.*`` settings
    (on ``eval.max_rows`` rows), logged into the trial's nested run (numbers, curves, their
    plot), then one result to Tune. Nothing is trained or checkpointed."""
    import torch

    from urm_ray import evaluate
    from urm_ray.train.loop import torch_threads

    torch.set_num_threads(torch_threads(cfg.resources))
    report = evaluate.evaluate(ctx.space.spec.checkpoint, cfg.eval,
                               evaluate.Request("testtime", max_rows=cfg.eval.max_rows))
    run = (tracking.Run.find(ctx.tracking_uri, ctx.experiment, name)
           or tracking.Run.open(ctx.tracking_uri, ctx.experiment, name, params, tags))
    evaluate.log_into(run, report, 1)
    ray.tune.report(derived.add({**report.metrics, "step": 1}))


def _replay_finished(ctx: TrialContext, name: str, derived: Derived) -> bool:
    """A trial finished before an interruption: report its recorded result instead of training."""
    found = tracking.Run.find(ctx.tracking_uri, ctx.experiment, name)
    if found is None:
        return False
    run = found.summary()
    fate = run.tags.get(FATE_TAG)
    if fate == INTERRUPTED:  # stopped with its sweep: it trains on, so no fate is recorded yet
        found.delete_tags([FATE_TAG, REASON_TAG])
        return False
    if fate is None:
        return False
    if fate == "failed":
        # failed before an interruption or a retry (e.g. diverged): it would fail again
        raise RuntimeError(f"trial {name} already failed: {run.tags.get(REASON_TAG, '')}")
    metrics = {**run.metrics, "step": int(run.tags.get(STEP_TAG, 0))}
    ray.tune.report(derived.add(metrics))
    return True
