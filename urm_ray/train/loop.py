"""The per-worker training loop run by Ray Train's TorchTrainer (one call per DDP rank).

Each optimizer step runs ONE ACT segment (deep supervision): rows that halted in the previous
step are replaced by fresh examples inside the model's carry, the carry is detached between
segments, and TBPTL happens inside the model. Every rank reports at the same steps (``report``
is a barrier); rank 0 writes checkpoints and logs to MLflow.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Generator, Iterator
from contextlib import closing, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch import nn

from urm_ray.config import RunConfig, TrainConfig, build_config
from urm_ray.data import stream
from urm_ray.data.store import DatasetMeta
from urm_ray.data.tasks import registry
from urm_ray.data.tasks.arc.evaluate import PASS_KS, evaluate_arc
from urm_ray.data.tasks.verify import Search, Verifier, nearest_for, optional_verifier, verifier_for
from urm_ray.errors import TrainingDiverged
from urm_ray.losses import act_loss
from urm_ray.models.gram import Guided
from urm_ray.models.registry import build_model
from urm_ray.models.task import TaskSpec
from urm_ray.optim import EMA, apply_scheduled_lr, build_optimizers
from urm_ray.tracking import Tracker, make_tracker
from urm_ray.train import checkpoint
from urm_ray.train.checkpoint import Position
from urm_ray.train.compiled import compile_enabled, compile_model, compiled_loss
from urm_ray.train.evaluate import held_out_metrics
from urm_ray.train.live import Sender
from urm_ray.typed import to_dict


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Entry point for each Ray Train worker. ``loop_config``: config dict, MLflow run id/URI,
    the driver's progress inbox (None: nobody watches), the run's folder on local storage ("":
    remote storage), whether the loop runs in the driver's process (Ray Train's local mode,
    which keeps no checkpoints: the loop writes them into that folder itself) and on a GPU."""
    cfg = build_config(loop_config["config"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    progress = Sender(loop_config["progress"] if rank == 0 else None)
    progress.phase(f"building the model ({cfg.model.name}) on {world} worker(s)")
    torch.set_num_threads(_threads(cfg))
    torch.manual_seed(cfg.train.seed)  # identical init on every rank (DDP also broadcasts)
    meta = stream.load_meta(cfg.data)
    task = TaskSpec(meta.vocab_size, meta.seq_len, stream.puzzle_table_size(meta, cfg.data))
    model = build_model(cfg.model, task)
    torch.manual_seed(checkpoint.rank_seed(cfg.train.seed, rank))  # then each rank draws its own
    device = _device(loop_config)
    # DDP broadcasts rank 0's weights; the puzzle table is a buffer updated identically on every
    # rank by the sign-SGD optimizer (which all-gathers its rows), so buffers are not broadcast.
    wrapped = ray.train.torch.prepare_model(
        model, move_to_device=device, parallel_strategy_kwargs={"broadcast_buffers": False}
    )
    ema = EMA(model, cfg.optim.ema_decay) if cfg.optim.ema else None
    optimizers = build_optimizers(model, cfg.optim)
    run_folder = Path(loop_config["run_folder"]) if loop_config["run_folder"] else None
    position, carry = _maybe_restore(model, ema, optimizers, rank, cfg.train.seed, run_folder)
    if position.step:
        progress.phase(f"restored step {position.step} from the latest checkpoint")
    tracker = make_tracker(loop_config["tracking_uri"], loop_config["run_id"], rank == 0)
    trainer = Trainer(cfg, model, wrapped, ema, optimizers, tracker, device, rank, world, meta.seq_len)
    trainer.verifier, search = task_hooks(cfg, meta)
    if getattr(cfg.model, "prior_match_targets", "label") == "nearest":
        trainer.prior_targets = search
    if cfg.train.label_targets == "nearest":
        trainer.label_targets = search
    trainer.eval_verifier = optional_verifier(meta.task, meta.seq_len)
    if registry.of(meta).versioned:
        trainer.arc_views = cfg.train.eval_arc_views
    trainer.progress = progress
    trainer.persist_to = run_folder if loop_config["in_process"] else None
    trainer.run(position, None if carry is None else carry.to(device))


def task_hooks(cfg: RunConfig, meta: DatasetMeta) -> tuple[Verifier | None, Search | None]:
    """The task's pieces the config asks for: the verifier of GRAM's ``model.halt_target: verifier``
    and the search of ``model.prior_match_targets: nearest`` or ``train.label_targets: nearest``
    (None where not asked for).
    ConfigError where the task has none; the driver calls it before Ray starts."""
    verifier = search = None
    if getattr(cfg.model, "halt_target", "label") == "verifier":
        verifier = verifier_for(meta.task, meta.seq_len)
    if "nearest" in (getattr(cfg.model, "prior_match_targets", "label"), cfg.train.label_targets):
        search = nearest_for(meta.task, meta.seq_len, meta.vocab_size)
    return verifier, search


def _device(loop_config: dict[str, Any]) -> torch.device:
    """The worker's device from Ray Train; in the driver's process (Ray Train's local mode takes
    any visible GPU) the driver's choice: the current GPU, or the CPU for ``train.device=cpu``."""
    if not loop_config["in_process"]:
        return ray.train.torch.get_device()
    return torch.device("cuda", torch.cuda.current_device()) if loop_config["gpu"] else torch.device("cpu")


def bf16_enabled(device: torch.device, bf16: bool | str) -> bool:
    """Whether training autocasts to bf16: on CUDA unless ``bf16`` is false; on CPU only when true."""
    return bf16 is True or (bf16 == "auto" and device.type == "cuda")


def bf16_autocast(device: torch.device, bf16: bool | str) -> Any:
    """The training autocast (``bf16_enabled``), or none."""
    if bf16_enabled(device, bf16):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def _per_row(metric: str) -> bool:
    """Losses, the KL and GRAM's prior match are summed over every row; the other metrics over
    halted rows only."""
    return metric.endswith("_loss") or metric.startswith(("kl", "prior_"))


def _first_nonfinite(first: torch.Tensor, nonfinite: torch.Tensor, step: int) -> torch.Tensor:
    """The first step whose loss or gradients were not finite (-1: none yet); stays on the device."""
    return torch.where((first < 0) & (nonfinite > 0), step, first)


def _upload(ckpt: ray.train.Checkpoint, name: str, step: int) -> ray.train.Checkpoint:
    """Ray Train's checkpoint upload, made atomic (``checkpoint.upload``)."""
    storage = ray.train.get_context().get_storage()
    dest = storage.build_checkpoint_path_from_name(name)
    checkpoint.upload(Path(ckpt.path), storage.storage_filesystem, dest, step)
    return ray.train.Checkpoint(dest, filesystem=storage.storage_filesystem)


def _every(period: int, step: int) -> bool:
    return period > 0 and step % period == 0


def _report_due(cfg: TrainConfig, step: int) -> bool:
    """Every rank reports at the same steps: logging, evaluation, checkpoint and the last step."""
    return step == cfg.steps or any(
        _every(period, step) for period in (cfg.log_every, cfg.eval_every, cfg.checkpoint_every))


def _threads(cfg: RunConfig) -> int:
    return cfg.train.torch_threads or max(1, int(cfg.train.cpus_per_worker))


def _maybe_restore(model: nn.Module, ema: EMA | None, optimizers: list[Any], rank: int,
                   seed: int, run_folder: Path | None) -> tuple[Position, Any]:
    """From Ray Train's latest checkpoint of the run, else (a run in the driver's process, or one
    that an in-process run began) the newest complete one in its local folder."""
    ckpt = ray.train.get_checkpoint()
    if ckpt is None and run_folder is not None:
        latest = checkpoint.latest_local(run_folder)
        ckpt = None if latest is None else ray.train.Checkpoint(str(latest))
    if ckpt is None:
        return Position(), None
    with ckpt.as_directory() as folder:
        state = checkpoint.load_state(Path(folder))
    return checkpoint.restore(state, model, ema, optimizers, rank, seed)


class Trainer:
    """Holds one worker's training state; ``run`` trains from a position to ``train.steps``."""

    def __init__(self, cfg: RunConfig, model: nn.Module, wrapped: nn.Module, ema: EMA | None,
                 optimizers: list[Any], tracker: Tracker, device: torch.device, rank: int,
                 world: int, seq_len: int) -> None:
        self.cfg, self.model, self.wrapped, self.ema = cfg, model, wrapped, ema
        self.optimizers, self.tracker, self.device = optimizers, tracker, device
        self.rank, self.world, self.seq_len = rank, world, seq_len
        self.local_batch = cfg.train.global_batch_size // world
        self.loss_fn = act_loss
        if compile_enabled(cfg.train.compile, device):
            compile_model(model)
            self.loss_fn = compiled_loss()
        self.last_eval: dict[str, float] = {}
        # GRAM's halting target "a task verifier accepts it" (None = "equals the label")
        self.verifier: Verifier | None = None
        # GRAM's prior match: the targets of rows alone with their input, from their prior decodes
        # (model.prior_match_targets; None = their labels)
        self.prior_targets: Search | None = None
        # the answer loss's targets from the rows' own decodes (train.label_targets; None = labels)
        self.label_targets: Search | None = None
        # judges held-out answers: eval/valid_accuracy and, with train.eval_samples > 0, the
        # sampled answers' validity and coverage (None = "equals the label")
        self.eval_verifier: Verifier | None = None
        # ARC data: augmented views of each held-out test input voted for arc/pass_at_k (0 = none)
        self.arc_views = 0
        self.progress = Sender()  # rank 0 of a watched run: sends its steps to the driver
        # in the driver's process (Ray Train's local mode, which stores nothing): the run's
        # local folder, where ``_report`` writes the checkpoints itself (None: Ray Train does)
        self.persist_to: Path | None = None

    def run(self, position: Position, carry: Any = None) -> None:
        """Train from ``position`` (and the restored ACT ``carry``, if any) to ``train.steps``."""
        # Closed as soon as training ends or fails: a suspended generator is otherwise closed by
        # the garbage collector only (not while a traceback holds this frame), and until then Ray
        # Data's prefetch thread runs on in this worker and the SplitCoordinator's epoch with it.
        with closing(self._batches(position)) as batches:
            self._train(position, batches, carry)
        self.progress.phase("stopping the workers")  # Ray Train tears the worker group down next
        self.tracker.close()

    def _train(self, position: Position, batches: Iterator[dict[str, torch.Tensor]], carry: Any) -> None:
        cfg = self.cfg.train
        first_nonfinite = torch.full((), -1, device=self.device)
        sums: dict[str, torch.Tensor] = {}
        window_start, window_steps = time.perf_counter(), 0
        self.progress.start(position.step)
        while position.step < cfg.steps:
            batch = next(batches)
            lr = apply_scheduled_lr(self.optimizers, self.cfg.optim, position.step, cfg.steps)
            if isinstance(self.model, Guided):
                self.model.schedule(position.step)
            carry, metrics = self._step(carry, batch)
            position.step += 1
            window_steps += 1
            self.progress.step(position.step)
            first_nonfinite = _first_nonfinite(first_nonfinite, metrics.pop("nonfinite"), position.step)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0) + value
            if _report_due(cfg, position.step):
                self._stop_if_diverged(first_nonfinite)
                elapsed = time.perf_counter() - window_start
                report = self._train_metrics(sums, window_steps, elapsed, lr)
                self._report(position, report, carry)
                sums, window_start, window_steps = {}, time.perf_counter(), 0

    def _batches(self, position: Position) -> Generator[dict[str, torch.Tensor], None, None]:
        """Endless batches from the saved data position; updates ``position`` as it goes."""
        shard = ray.train.get_dataset_shard("train")
        skip = position.batch
        while True:
            rows = stream.iter_torch_batches(
                shard, self.local_batch, epoch=position.epoch, seed=self.cfg.data.shuffle_seed,
                shuffle=True, drop_last=True, buffer_rows=self.cfg.data.shuffle_buffer,
            )
            for index, batch in enumerate(rows):
                if index < skip:
                    continue
                position.batch = index + 1
                yield {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            position.epoch, position.batch, skip = position.epoch + 1, 0, 0

    def _autocast(self) -> Any:
        return bf16_autocast(self.device, self.cfg.train.bf16)

    def _step(self, carry: Any, batch: dict[str, torch.Tensor]) -> tuple[Any, dict[str, torch.Tensor]]:
        if carry is None:
            carry = self.model.initial_carry(batch)
        self.wrapped.train()
        with self._autocast():
            carry, outputs = self.wrapped(carry, batch)
            halt_target = prior_targets = None
            data, labels = carry.current_data, carry.current_data["labels"]
            if self.verifier is not None:
                judged = outputs.get("halt_logits", outputs["logits"])  # GRAM: a prior decode
                halt_target = self.verifier(judged.detach().argmax(-1), data["inputs"], data["labels"])
            if self.prior_targets is not None and "prior_logits" in outputs:
                prior_targets = self.prior_targets(outputs["prior_logits"].detach().argmax(-1), data["inputs"],
                                                   data["labels"])
            if self.label_targets is not None:
                labels = self.label_targets(outputs["logits"].detach().argmax(-1), data["inputs"], labels)
            loss, metrics = self.loss_fn(
                outputs, labels, carry.halted, carry.steps, self.cfg.train.loss,
                halt_target=halt_target, inputs=data["inputs"], prior_targets=prior_targets,
            )
        # Official scaling: sum over the global batch / global batch size. DDP averages
        # gradients over ranks, so each rank divides by its local batch size.
        (loss / self.local_batch).backward()
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.cfg.optim.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.optim.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        metrics["nonfinite"] = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)
        # metrics stay on the device (no host sync per step); ``run`` sums them there and reads
        # them at the report steps
        return carry, {k: v.detach().double() for k, v in metrics.items()}

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
        if self.world == 1 or not dist.is_initialized():
            return sums
        keys = sorted(sums)
        packed = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64, device=self.device)
                              for k in keys])
        dist.all_reduce(packed)
        return dict(zip(keys, packed.cpu()))

    def _train_metrics(self, sums: dict[str, torch.Tensor], steps: int, seconds: float,
                       lr: float) -> dict[str, float]:
        """Per-row averages: episode metrics over halted rows, losses over all rows seen."""
        sums = self._all_reduce(sums)
        halted = max(float(sums.pop("count")), 1.0)
        rows = steps * self.cfg.train.global_batch_size
        out = {f"train/{k}": float(v) / (rows if _per_row(k) else halted) for k, v in sums.items()}
        out["train/lr"] = lr
        out["train/samples_per_s"] = rows / seconds
        out["train/tokens_per_s"] = rows * self.seq_len / seconds
        return out

    def _evaluate(self) -> dict[str, float]:
        """Held-out metrics over every eval row once: each rank reads the whole (unsplit) split
        in stored order and scores every world-th batch; the sums are all-reduced."""
        rows = ray.train.get_dataset_shard("eval")

        def batches() -> Iterator[dict[str, torch.Tensor]]:
            stored = stream.iter_torch_batches(
                rows, self.cfg.train.eval_batch_size, epoch=0, seed=0, shuffle=False,
                drop_last=False, buffer_rows=0,
            )
            return ({k: v.to(self.device) for k, v in b.items()}
                    for i, b in enumerate(stored) if i % self.world == self.rank)

        with self.evaluation_model() as model:
            metrics = held_out_metrics(model, batches, self.cfg.train.eval_samples,
                                       self.eval_verifier, reduce=self._all_reduce)
            if self.arc_views:
                metrics.update(self.arc_metrics(model))
        return metrics

    @contextmanager
    def evaluation_model(self) -> Iterator[nn.Module]:
        """The model in eval mode with the EMA weights applied (when the run keeps an EMA), under
        the training autocast; training weights and mode come back on exit."""
        averaged = self.ema.applied(self.model) if self.ema is not None else nullcontext(self.model)
        with averaged as model, self._autocast():
            model.eval()
            try:
                yield model
            finally:
                model.train()

    def arc_metrics(self, model: nn.Module) -> dict[str, float]:
        """``urm-ray eval``'s ARC vote over ``arc_views`` views of each held-out test input, with
        pass@k for k up to the views (pass@1 and pass@2 always). Each rank votes on a share of the
        test pairs; ``_gather`` brings every rank the others' results (a collective)."""
        views = self.arc_views
        report = evaluate_arc(
            model, self.cfg.data, self.cfg.data.eval_split, num_augmentations=views,
            batch_size=self.cfg.train.eval_batch_size,
            pass_ks=tuple(k for k in PASS_KS if k <= max(views, 2)),
            max_pairs=self.cfg.train.eval_max_rows, device=self.device,
            ranks=(self.rank, self.world), gather=self._gather)
        return report["metrics"]

    def _gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (a collective: every rank calls it)."""
        if self.world == 1 or not dist.is_initialized():
            return [value]
        values: list[Any] = [None] * self.world
        dist.all_gather_object(values, value)
        return values

    def _report(self, position: Position, metrics: dict[str, float], carry: Any) -> None:
        cfg = self.cfg.train
        done = position.step == cfg.steps
        if _every(cfg.eval_every, position.step) or done:
            self.progress.phase(f"evaluating at step {position.step}")
            self.last_eval = self._evaluate()
            metrics.update(self.last_eval)
        self.tracker.log(metrics, position.step)
        metrics = {**self.last_eval, **metrics, "step": position.step, "epoch": position.epoch}
        self.progress.report(position.step, metrics)
        save = _every(cfg.checkpoint_every, position.step) or done
        if not save:
            ray.train.report(metrics)
            return
        self.progress.phase(f"saving the checkpoint at step {position.step}")
        ranks = self._gather(checkpoint.rank_state(carry))
        with tempfile.TemporaryDirectory() as folder:
            if self.rank == 0:
                checkpoint.save(Path(folder), self.model, self.ema, self.optimizers, position,
                                to_dict(self.cfg), ranks)
            self._report_checkpoint(Path(folder), metrics, position.step)

    def _report_checkpoint(self, folder: Path, metrics: dict[str, Any], step: int) -> None:
        """Report the metrics with rank 0's checkpoint in ``folder`` (other ranks report none)."""
        if self.persist_to is not None:  # the one rank, in the driver's process
            dest = checkpoint.persist_local(folder, self.persist_to, step, self.cfg.train.keep_checkpoints)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint(str(dest)))
            return
        ckpt = ray.train.Checkpoint.from_directory(str(folder)) if self.rank == 0 else None
        ray.train.report(metrics, checkpoint=ckpt,
                         checkpoint_upload_fn=lambda ckpt, name: _upload(ckpt, name, step))
