"""What one training step holds in GPU memory, and the largest micro-batch that fits a GPU.

    memory = step_memory(cfg, task)            # counted once for the config's model and shapes
    memory.peak(rows=96)                       # bytes at the step's peak with 96 rows per pass
    memory.largest_micro_batch(GPUS["a100-40"], local_batch=96)

The activations are not estimated from a formula: the step's forward and loss run under
autograd's saved-tensor hooks, which see every tensor the backward will need, with its dtype and
size, as the real step keeps it (under bf16 autocast when the config trains in bf16; with the
looped blocks checkpointed when ``train.activation_checkpointing`` is on). The forward runs on
fake tensors (``FakeTensorMode``: shapes and dtypes, no data, no arithmetic), so counting a
paper-sized model at ARC's 900 tokens takes a second on a laptop. Each tensor's storage counts
once, however many ops save it. Two counts, at one row and at two, give the bytes per row (the
step is linear in rows) and what does not grow with rows.

The rest is exact arithmetic on the built objects: weights, gradients, the optimizers' state (one
step taken on zero gradients), the EMA copy, buffers (the puzzle-embedding table), and the ACT
carry (the old and the new one live together). Not counted and kept as a fixed reserve
(``RESERVED``): the CUDA context, cuBLAS and cuDNN workspaces, the allocator's rounding.

Counted on the CPU, attention follows the CPU path (``layers.attend``): under bf16 it runs in
float32 there, where a GPU's fused kernel keeps bf16 tensors, so the estimate is a little above
what a GPU holds (a safe side). With checkpointed blocks, the backward recomputes one block at a
time: the bytes of one block's pass are added once (``recompute``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call

from urm_ray.config import RunConfig
from urm_ray.models.layers import Block
from urm_ray.models.registry import build_model
from urm_ray.models.task import TaskSpec
from urm_ray.objectives import objective_for
from urm_ray.optim import EMA, build_optimizers
from urm_ray.train.activations import checkpoint_blocks

MIB = 1 << 20
# memory.total as nvidia-smi reports it, MiB
GPUS: dict[str, int] = {"a10g": 23028, "l4": 23034, "a100-40": 40960, "a100-80": 81920, "h100": 81559}
RESERVED = 1536 * MIB  # CUDA context, library workspaces, allocator rounding
FITS = 0.9  # a plan fits when its peak is at most this share of the GPU's memory


@dataclass(frozen=True)
class StepMemory:
    """Bytes of one worker's training step (see the module docstring)."""

    state: int  # weights, gradients, optimizer state, EMA, buffers
    saved_per_row: int  # saved for backward, per row of a forward pass
    fixed: int  # saved bytes that do not grow with rows (e.g. RoPE tables)
    carry_per_row: int  # the ACT carry, old and new
    recompute: int  # per row: one checkpointed block's pass, recomputed in the backward (0: off)

    @property
    def per_row(self) -> int:
        return self.saved_per_row + self.carry_per_row + self.recompute

    def saved(self, rows: int) -> int:
        """Bytes saved for backward by a forward of ``rows`` rows."""
        return self.fixed + rows * self.saved_per_row

    def peak(self, rows: int) -> int:
        """The step's peak with ``rows`` rows per forward/backward pass (the micro-batch)."""
        return self.state + self.fixed + rows * self.per_row + RESERVED

    def largest_micro_batch(self, gpu_mib: int, local_batch: int) -> int:
        """The largest divisor of ``local_batch`` whose peak fits ``FITS`` of the GPU; 0: none."""
        fitting = [rows for rows in range(1, local_batch + 1)
                   if local_batch % rows == 0 and self.fits(rows, gpu_mib)]
        return max(fitting, default=0)

    def fits(self, rows: int, gpu_mib: int) -> bool:
        return self.peak(rows) <= FITS * gpu_mib * MIB


def step_memory(cfg: RunConfig, task: TaskSpec) -> StepMemory:
    """Count the step of ``cfg`` on a dataset of ``task``'s shape."""
    small = TaskSpec(task.vocab_size, task.seq_len, 1)  # the puzzle table's rows: in _state_bytes
    model, plain = _model(cfg, small), _model(cfg, small, checkpointed=False)
    block = next(m for m in plain.modules() if isinstance(m, Block))
    fake = FakeTensorMode(allow_non_fake_inputs=True)  # e.g. RoPE tables cached off the buffers
    with fake:
        one, two = (saved_bytes(cfg, model, task, rows, fake) for rows in (1, 2))
        recompute = 0
        if cfg.train.activation_checkpointing:
            recompute = saved_bytes(cfg, block, task, 1, fake, inputs=_block_inputs(plain, task))
    return StepMemory(_state_bytes(cfg, task), two - one, 2 * one - two, 2 * _carry_bytes(model, task),
                      recompute)


def saved_bytes(cfg: RunConfig, module: nn.Module, task: TaskSpec, rows: int,
                fake: FakeTensorMode | None = None, inputs: Callable[[int], tuple] | None = None) -> int:
    """Bytes of the distinct storages autograd saves for backward in one forward (and loss) of
    ``module`` on ``rows`` rows, parameters excluded, under the config's autocast. ``module`` is
    the model, unless ``inputs`` makes its arguments (e.g. one block's). Under a
    ``FakeTensorMode`` (``fake``, entered) nothing is computed; without one, a real forward."""
    tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    if fake is not None:  # fake copies of the weights, made once (not at every op)
        tensors = {name: fake.from_tensor(t) for name, t in tensors.items()}
    params = {t.untyped_storage()._cdata for t in tensors.values()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in params:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    module.train()
    with (torch.autograd.graph.saved_tensors_hooks(pack, _same),
          torch.autocast("cpu", dtype=torch.bfloat16, enabled=_bf16(cfg))):
        if inputs is not None:
            functional_call(module, tensors, inputs(rows))
        else:
            step = _Forward(module, objective_for(cfg))
            functional_call(step, {f"model.{name}": t for name, t in tensors.items()}, (_batch(task, rows),))
    return sum(saved.values())


class _Forward(nn.Module):
    """A training step's forward: a fresh carry, one segment, the loss."""

    def __init__(self, model: nn.Module, objective: Callable[..., Any]) -> None:
        super().__init__()
        self.model, self.objective = model, objective

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        carry, outputs = self.model(self.model.initial_carry(batch), batch)
        return self.objective(outputs, carry)[0]


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _bf16(cfg: RunConfig) -> bool:
    """The precision the step trains in on a GPU (``train.bf16``: auto is on there)."""
    return cfg.train.bf16 is not False


def _model(cfg: RunConfig, task: TaskSpec, checkpointed: bool | None = None) -> nn.Module:
    """The model with uninitialised weights (no initialisation cost: only sizes matter here;
    fake ones under a ``FakeTensorMode``)."""
    with torch.device("meta"):
        model = build_model(cfg.model, task)
    model = model.to_empty(device="cpu")
    if cfg.train.activation_checkpointing if checkpointed is None else checkpointed:
        checkpoint_blocks(model)
    return model


def _batch(task: TaskSpec, rows: int) -> dict[str, torch.Tensor]:
    inputs = torch.ones(rows, task.seq_len, dtype=torch.int32)
    return {"inputs": inputs, "labels": inputs.long(),
            "puzzle_identifiers": torch.zeros(rows, dtype=torch.int32)}


def _block_inputs(model: nn.Module, task: TaskSpec) -> Callable[[int], tuple]:
    """One block's arguments (h [rows, T, D], the RoPE tables) for ``rows`` rows."""
    length = model.prefix_len + task.seq_len

    def make(rows: int) -> tuple:
        hidden = torch.zeros(rows, length, model.config.hidden_size, requires_grad=True)
        return hidden, model.rope(length)

    return make


def _carry_bytes(model: nn.Module, task: TaskSpec) -> int:
    """Bytes of one row's ACT carry (state, counters, the rows' data)."""
    carry = model.initial_carry(_batch(task, 1))
    leaves = torch.utils._pytree.tree_leaves(carry)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _state_bytes(cfg: RunConfig, task: TaskSpec) -> int:
    """Weights, gradients, optimizer state, EMA and buffers of the full-size model (the real
    puzzle-embedding table), on the meta device: sizes only."""
    with torch.device("meta"):
        model = build_model(cfg.model, task)
        optimizers = build_optimizers(model, cfg.optim)
        for param in model.parameters():
            param.grad = torch.zeros_like(param)
        for optimizer in optimizers:
            optimizer.step()
        ema = EMA(model, cfg.optim.ema_decay) if cfg.optim.ema else None
    tensors = [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters())]
    for optimizer in optimizers:
        tensors += [t for state in getattr(optimizer, "state", {}).values() for t in state.values()
                    if isinstance(t, torch.Tensor)]
    if ema is not None:
        tensors += list(ema.shadow.values())
    return sum(t.numel() * t.element_size() for t in tensors)
