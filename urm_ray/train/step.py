"""One worker's training state and the training step: plain PyTorch, no Ray, no MLflow.

    state = build_state(cfg, meta.task_spec, device)      # model, optimizers, EMA, schedule, carry
    metrics = train_step(state, batch)                    # one ACT segment, backward, update, EMA

Each step runs ONE ACT segment (deep supervision): rows that halted in the previous step are
replaced by fresh examples inside the model's carry, the carry is detached between segments, and
TBPTL happens inside the model. With ``train.micro_batch_size`` the worker's rows (and their
carry) go through forward and backward in micro-batches whose gradients add up before the one
optimizer step (gradient accumulation): the same step as one batch, in less memory. What couples
rows of a batch (GRAM's prior match pairs rows with the same input) couples them within a
micro-batch, as it does within a worker's share of the global batch. ``train_step`` sets the step's learning rate (and a scheduled
model's step) from ``state.position.step`` and advances it. Metrics stay on the device (no host
sync per step): the loop sums them and reads them at its report steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils._pytree import tree_map

from urm_ray.config import RunConfig
from urm_ray.models.registry import build_model
from urm_ray.models.task import TaskSpec
from urm_ray.optim import EMA, apply_scheduled_lr, build_optimizers
from urm_ray.objectives import Objective, objective_for
from urm_ray.train.activations import checkpoint_blocks
from urm_ray.train.checkpoint import Position
from urm_ray.train.compiled import compile_enabled, compile_model


@dataclass
class TrainState:
    """Everything one worker trains: built by ``build_state``, advanced by ``train_step``.

    ``model`` is the single-device model (what checkpoints and evaluation use); ``wrapped`` is
    what the step calls (DDP around ``model`` on several workers, else ``model`` itself)."""

    cfg: RunConfig
    model: nn.Module
    wrapped: nn.Module
    ema: EMA | None
    optimizers: list[Any]
    device: torch.device
    local_batch: int  # rows per step on this worker
    seq_len: int  # tokens per row
    objective: Objective = field(default_factory=Objective)
    position: Position = field(default_factory=Position)
    carry: Any = None  # the ACT carry of the rows in flight (None: the next batch starts afresh)
    lr: float = 0.0  # the network's learning rate at the last step


def build_state(cfg: RunConfig, task: TaskSpec, device: torch.device, *, objective: Objective | None = None,
                world: int = 1, wrap: Callable[[nn.Module], nn.Module] | None = None) -> TrainState:
    """Model (seeded by ``train.seed``), optimizers, EMA and the compiled parts for one worker.
    ``objective``: what the step trains (default: ``objective_for(cfg)``, which asks no task hook);
    ``wrap`` places the model (Ray Train's ``prepare_model`` for DDP); default: moved to ``device``."""
    torch.manual_seed(cfg.train.seed)  # identical init on every rank (DDP also broadcasts)
    model = build_model(cfg.model, task)
    if cfg.train.activation_checkpointing:
        checkpoint_blocks(model)
    wrapped = wrap(model) if wrap is not None else model.to(device)
    ema = EMA(model, cfg.optim.ema_decay) if cfg.optim.ema else None
    optimizers = build_optimizers(model, cfg.optim)
    objective = objective or objective_for(cfg)
    if compile_enabled(cfg.train.compile, device):
        compile_model(model)
        objective = objective.compiled()
    return TrainState(cfg, model, wrapped, ema, optimizers, device,
                      cfg.train.global_batch_size // world, task.seq_len, objective)


def local_device(setting: str = "auto") -> torch.device:
    """The device this process trains or evaluates on for ``resources.device``: ``cuda`` its current
    GPU (the one Ray made visible to it), ``cpu`` the CPU, ``auto`` the GPU when it sees one."""
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A host batch on ``device``; on CUDA through pinned memory, asynchronously (the copy
    overlaps the work already queued instead of waiting for it)."""
    if device.type != "cuda":
        return {key: value.to(device) for key, value in batch.items()}
    return {key: value.pin_memory().to(device, non_blocking=True) for key, value in batch.items()}


def use_tf32(device: torch.device) -> None:
    """float32 matmuls and convolutions in TF32 on CUDA (Ampere and later: several times the
    float32 rate, 10 mantissa bits; bf16 autocast covers most of the step, this the rest:
    the loss, the optimizers, fp32 runs). What torchtitan and PyTorch's performance guide do."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def bf16_enabled(device: torch.device, bf16: bool | str) -> bool:
    """Whether training autocasts to bf16: on CUDA unless ``bf16`` is false; on CPU only when true."""
    return bf16 is True or (bf16 == "auto" and device.type == "cuda")


def bf16_autocast(device: torch.device, bf16: bool | str) -> Any:
    """The training autocast (``bf16_enabled``), or none."""
    if bf16_enabled(device, bf16):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def autocast(state: TrainState) -> Any:
    """The autocast ``state`` trains under."""
    return bf16_autocast(state.device, state.cfg.train.bf16)


def train_step(state: TrainState, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One optimizer step on ``batch`` (tensors on ``state.device``); returns the step's metric
    sums (on the device, float64) with ``nonfinite`` (the loss or gradient norm was inf or nan)."""
    cfg = state.cfg
    lr = apply_scheduled_lr(state.optimizers, cfg.optim, state.position.step, cfg.train.steps)
    state.model.schedule(state.position.step)  # e.g. GRAM's KL ramp
    if state.carry is None:
        state.carry = state.model.initial_carry(batch)
    state.wrapped.train()
    parts = micro_batches(state)
    if parts == 1:
        state.carry, loss, metrics = _forward_backward(state, state.carry, batch)
    else:
        carries, losses, sums = [], [], []
        for i in range(parts):
            with _gradients_kept_local(state.wrapped, keep=i < parts - 1):
                carry, loss, metrics = _forward_backward(state, _rows(state.carry, i, parts), _rows(batch, i, parts))
            carries.append(carry)
            losses.append(loss)
            sums.append(metrics)
        state.carry = tree_map(lambda *rows: torch.cat(rows), *carries)
        loss = torch.stack(losses).sum()
        metrics = {key: torch.stack([part[key] for part in sums]).sum(0) for key in sums[0]}
    params = [p for p in state.model.parameters() if p.grad is not None]
    if cfg.optim.grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    metrics["nonfinite"] = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
    for opt in state.optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    if state.ema is not None:
        state.ema.update(state.model)
    state.position.step += 1
    state.lr = lr
    return {k: v.detach().double() for k, v in metrics.items()}


def micro_batches(state: TrainState) -> int:
    """Forward/backward passes per optimizer step on this worker (``train.micro_batch_size``)."""
    size = state.cfg.train.micro_batch_size
    return state.local_batch // size if size else 1


def _forward_backward(state: TrainState, carry: Any, batch: dict[str, torch.Tensor]
                      ) -> tuple[Any, torch.Tensor, dict[str, torch.Tensor]]:
    with autocast(state):
        carry, outputs = state.wrapped(carry, batch)
        loss, metrics = state.objective(outputs, carry)
    # Official scaling: sum over the global batch / global batch size. DDP averages gradients
    # over ranks, so each rank divides by its local batch size (micro-batches add up to it).
    (loss / state.local_batch).backward()
    return carry, loss.detach(), metrics


def _rows(tree: Any, part: int, parts: int) -> Any:
    """Micro-batch ``part`` of ``parts``: the same rows of every tensor of a batch or a carry."""
    return tree_map(lambda t: t.tensor_split(parts)[part], tree)


def _gradients_kept_local(wrapped: nn.Module, keep: bool) -> Any:
    """DDP's ``no_sync`` for every micro-batch but the last: one all-reduce per step."""
    if keep and isinstance(wrapped, DistributedDataParallel):
        return wrapped.no_sync()
    return nullcontext()


@contextmanager
def evaluation_model(state: TrainState) -> Iterator[nn.Module]:
    """The model in eval mode with the EMA weights applied (when the run keeps an EMA), under the
    training autocast; training weights and mode come back on exit."""
    averaged = state.ema.applied(state.model) if state.ema is not None else nullcontext(state.model)
    with averaged as model, autocast(state):
        model.eval()
        try:
            yield model
        finally:
            model.train()
