"""The one training loop: drives ``train_step``, evaluates, reports and checkpoints.

    run_loop(cfg, meta, host, device, tracker)     # wherever it runs (see ``hosts``)

The same code runs in each Ray Train worker (``train_loop_per_worker``, one call per DDP rank),
in a Tune trial actor and in the command's own process; the host says where data comes from and
where reports and checkpoints go. Every rank reports at the same steps (a Ray Train report is a
barrier); rank 0 writes checkpoints and logs to MLflow.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch import nn

from urm_ray.config import ResourcesConfig, RunConfig, build_config
from urm_ray.data import originals, stream
from urm_ray.data.store import DatasetMeta
from urm_ray.errors import TrainingDiverged
from urm_ray.train.batches import TrainBatches
from urm_ray.train.evaluation import InRun, Ranks
from urm_ray.losses import per_row
from urm_ray.models.task import TaskSpec
from urm_ray.objectives import objective_for
from urm_ray.outbox import one_line
from urm_ray.tracking import FAILED_FLUSH_S, Tracker, run_of
from urm_ray.train import checkpoint
from urm_ray.train.hosts import Host, WorkerHost
from urm_ray.train.live import Sender
from urm_ray.train.step import TrainState, build_state, evaluation_model, to_device, train_step, use_tf32
from urm_ray.typed import to_dict

logger = logging.getLogger(__name__)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Entry point of each Ray Train worker. ``loop_config``: the config dict, the dataset's
    metadata as the driver read it, the MLflow run id and URI, and the driver's progress inbox
    (None: nobody watches)."""
    cfg = build_config(loop_config["config"])
    host = WorkerHost()
    progress = Sender(loop_config["progress"] if host.rank == 0 else None)
    tracker = run_of(loop_config["tracking_uri"], loop_config["run_id"]).tracker(host.rank == 0)
    # DDP broadcasts rank 0's weights; the puzzle table is a buffer updated identically on every
    # rank by the sign-SGD optimizer (which all-gathers its rows), so buffers are not broadcast.
    device = host.device()
    wrap = lambda model: ray.train.torch.prepare_model(  # noqa: E731
        model, move_to_device=device, parallel_strategy_kwargs={"broadcast_buffers": False})
    run_loop(cfg, loop_config["meta"], host, device, tracker, progress, wrap)


def task_spec(cfg: RunConfig, meta: DatasetMeta) -> TaskSpec:
    """The model's view of the dataset: vocabulary, sequence length, puzzle-embedding rows."""
    return TaskSpec(meta.vocab_size, meta.seq_len, stream.puzzle_table_size(meta, cfg.data))


def torch_threads(cfg: ResourcesConfig) -> int:
    """Intra-op threads of one worker: ``resources.torch_threads``, else the CPUs it was given."""
    return cfg.torch_threads or max(1, int(cfg.cpus_per_worker))


def run_loop(cfg: RunConfig, meta: DatasetMeta, host: Host, device: torch.device, tracker: Tracker,
             progress: Sender | None = None,
             wrap: Callable[[nn.Module], nn.Module] | None = None) -> None:
    """Build the worker's ``TrainState``, restore the host's latest checkpoint, train to
    ``train.steps``. The caller's torch thread count comes back at the end."""
    progress = progress or Sender()
    use_tf32(device)
    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads(cfg.resources))
    try:
        saved = host.saved_state()
        position = checkpoint.Position(**saved["position"]) if saved is not None else checkpoint.Position()
        # asked for now: Ray Data starts its pipeline while the model is built
        batches = TrainBatches(host.shard("train"), cfg.train.global_batch_size // host.world, position,
                               cfg.data.shuffle_seed, cfg.data.shuffle_buffer, device)
        with closing(batches):  # also when the model cannot be built
            progress.phase(f"building the model ({cfg.model.name}) on {host.world} worker(s)")
            state = build_state(cfg, task_spec(cfg, meta), device, objective=objective_for(cfg, meta),
                                world=host.world, wrap=wrap)
            if saved is None:
                torch.manual_seed(checkpoint.rank_seed(cfg.train.seed, host.rank))  # each rank its own draws
            else:
                _, carry = checkpoint.restore(saved, state.model, state.ema, state.optimizers, host.rank,
                                              cfg.train.seed)
                state.carry = None if carry is None else carry.to(device)
                progress.phase(f"restored step {position.step} from the latest checkpoint")
            state.position = position  # the one the batches advance
            Loop(state, host, tracker, progress, InRun.for_run(cfg, meta)).run(batches)
    finally:
        torch.set_num_threads(threads)


def _first_nonfinite(first: torch.Tensor, nonfinite: torch.Tensor, step: int) -> torch.Tensor:
    """The first step whose loss or gradients were not finite (-1: none yet); stays on the device."""
    return torch.where((first < 0) & (nonfinite > 0), step, first)


def _every(period: int, step: int) -> bool:
    return period > 0 and step % period == 0


def _report_due(cfg: RunConfig, step: int) -> bool:
    """Every rank reports at the same steps: logging, evaluation, checkpoint and the last step."""
    return step == cfg.train.steps or any(
        _every(period, step) for period in (cfg.train.log_every, cfg.eval.every, cfg.checkpoint.every))


class Loop:
    """Trains one worker's ``state`` from its position to ``train.steps`` on ``host``, evaluating
    with ``evaluation`` (``train.evaluation``)."""

    def __init__(self, state: TrainState, host: Host, tracker: Tracker, progress: Sender,
                 evaluation: InRun) -> None:
        self.state, self.host, self.tracker, self.progress = state, host, tracker, progress
        self.evaluation = evaluation
        self.cfg = state.cfg
        self.last_eval: dict[str, float] = {}
        # seconds this process spent in training steps and in evaluations (a trial's own work;
        # the rest of its time is start-up, checkpoints and tracking)
        self.seconds = {"time/train_s": 0.0, "time/eval_s": 0.0}

    def run(self, batches: TrainBatches) -> None:
        """Trains on ``batches`` to ``train.steps``; closes them as soon as training ends or fails
        (Ray Data's prefetch thread runs on in this worker until they are closed)."""
        self.tracker.connect()  # MLflow loads while the first batch is on its way
        try:
            with closing(batches):
                self._train(batches)
        except BaseException:
            self._close_tracker_after_failure()
            raise
        self.progress.phase("stopping the workers")
        # the last checkpoint is saved by now: a tracking store that stays away fails the run
        # (TrackingUnavailable) with nothing lost but the records not written
        self.tracker.close()

    def _close_tracker_after_failure(self) -> None:
        """Write what was logged before a failure, waiting briefly for an absent store: the
        failure is the error to report."""
        try:
            self.tracker.close(FAILED_FLUSH_S)
        except Exception as err:  # noqa: BLE001 (the run's own error follows)
            logger.warning("%s", one_line(err))

    def _train(self, batches: Iterator[dict[str, torch.Tensor]]) -> None:
        cfg, position = self.cfg.train, self.state.position
        first_nonfinite = torch.full((), -1, device=self.state.device)
        sums: dict[str, torch.Tensor] = {}
        window_start, window_steps = time.perf_counter(), 0
        self.progress.start(position.step)
        while position.step < cfg.steps:
            metrics = train_step(self.state, next(batches))
            window_steps += 1
            self.progress.step(position.step)
            first_nonfinite = _first_nonfinite(first_nonfinite, metrics.pop("nonfinite"), position.step)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0) + value
            if _report_due(self.cfg, position.step):
                self._stop_if_diverged(first_nonfinite)
                elapsed = time.perf_counter() - window_start
                self.seconds["time/train_s"] += elapsed
                self._report(self._train_metrics(sums, window_steps, elapsed))
                sums, window_start, window_steps = {}, time.perf_counter(), 0

    def _stop_if_diverged(self, first_nonfinite: torch.Tensor) -> None:
        """Raise TrainingDiverged (on every rank alike) if any rank saw a non-finite loss or
        gradient since the start: before evaluating or writing a checkpoint of broken weights."""
        seen = self._all_reduce({"nonfinite": (first_nonfinite >= 0).double()})["nonfinite"]
        if float(seen) > 0:
            step = int(first_nonfinite)
            where = f" {step}" if step >= 0 else " (on another rank)"
            raise TrainingDiverged(f"{TrainingDiverged.PREFIX}{where}: the loss or the gradient norm is "
                                   "inf or nan; no checkpoint was written after it")

    def _all_reduce(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.host.world == 1 or not dist.is_initialized():
            return sums
        keys = sorted(sums)
        packed = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64, device=self.state.device)
                              for k in keys])
        dist.all_reduce(packed)
        return dict(zip(keys, packed.cpu()))

    def _gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (a collective: every rank calls it)."""
        if self.host.world == 1 or not dist.is_initialized():
            return [value]
        values: list[Any] = [None] * self.host.world
        dist.all_gather_object(values, value)
        return values

    def _gather_to_zero(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` on rank 0, in rank order (None elsewhere): what only rank 0
        writes, such as every rank's carry for the checkpoint, is not copied to every rank."""
        if self.host.world == 1 or not dist.is_initialized():
            return [value]
        values: list[Any] | None = [None] * self.host.world if self.host.rank == 0 else None
        dist.gather_object(value, values, dst=0)
        return values

    def _train_metrics(self, sums: dict[str, torch.Tensor], steps: int, seconds: float) -> dict[str, float]:
        """Per-row averages: episode metrics over halted rows, losses over all rows seen."""
        sums = self._all_reduce(sums)
        halted = max(float(sums.pop("count")), 1.0)
        rows = steps * self.cfg.train.global_batch_size
        out = {f"train/{k}": float(v) / (rows if per_row(k) else halted) for k, v in sums.items()}
        out["train/lr"] = self.state.lr
        out["train/samples_per_s"] = rows / seconds
        out["train/tokens_per_s"] = rows * self.state.seq_len / seconds
        return out

    def _evaluate(self) -> dict[str, float]:
        """Held-out metrics over every eval row once (``train.evaluation``): each rank holds the
        whole split in stored order and scores every world-th batch; sums are all-reduced."""
        rows, rank, world = self.evaluation.heldout, self.host.rank, self.host.world
        device = self.state.device

        def batches(size: int) -> Iterator[dict[str, torch.Tensor]]:
            return (to_device(b, device) for b in originals.batches(rows, size, rank, world))

        ranks = Ranks(rank, world, device, self._all_reduce, self._gather)
        with evaluation_model(self.state) as model:
            return self.evaluation.run(model, batches, ranks, self.state.position.step,
                                       lambda plot: self.tracker.log_artifact(plot, "curves"))

    def _report(self, metrics: dict[str, float]) -> None:
        cfg, position = self.cfg.train, self.state.position
        done = position.step == cfg.steps
        if _every(self.cfg.eval.every, position.step) or done:
            self.progress.phase(f"evaluating at step {position.step}")
            start = time.perf_counter()
            self.last_eval = self._evaluate()
            self.seconds["time/eval_s"] += time.perf_counter() - start
            metrics.update(self.last_eval)
        metrics.update(self.seconds)
        self.tracker.log(metrics, position.step)
        metrics = {**self.last_eval, **metrics, "step": position.step, "epoch": position.epoch}
        self.progress.report(position.step, metrics)
        if not (_every(self.cfg.checkpoint.every, position.step) or done):
            self.host.report(metrics, None, position.step)
            return
        self.progress.phase(f"saving the checkpoint at step {position.step}")
        ranks = self._gather_to_zero(checkpoint.rank_state(self.state.carry))
        with tempfile.TemporaryDirectory() as folder:
            written = Path(folder) if self.host.rank == 0 else None
            if written is not None:
                checkpoint.save(written, self.state.model, self.state.ema, self.state.optimizers,
                                position, to_dict(self.cfg), ranks)
            self.host.report(metrics, written, position.step)
