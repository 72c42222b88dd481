"""Adaptive computation time (ACT): the carry between segments and the halting logic.

Every recurrent family subclasses ``ACTModel`` and supplies three hooks (``empty_state``,
``reset_state``, ``segment``); the segment loop, partial reset of finished rows, Q-halting with
exploration and HRM's bootstrapped Q-continue target live here once.

    carry = model.initial_carry(batch)          # every row halted, so the first call resets it
    carry, outputs = model(carry, batch)        # one segment; repeat with fresh batches

A row whose carry says ``halted`` restarts from the init state with the incoming batch's row;
the other rows keep their state and their original data. Gradients never cross segments.
"""

from dataclasses import dataclass, fields, replace
from typing import Callable

import torch
import torch.export
from torch import Tensor, nn

State = dict[str, Tensor]  # recurrent state(s) by name, each [B, T, D]
Batch = dict[str, Tensor]  # inputs [B, L], labels [B, L], puzzle_identifiers [B]


@dataclass
class ACTCarry:
    """What one segment hands to the next; every tensor detached.

    Registered as a pytree node, so ``torch.utils._pytree.tree_map`` and ``torch.export`` can
    traverse it; DDP passes it through unchanged (it moves only plain tensors and containers).
    Create it from a batch already on the model's device, or move it with ``carry.to(device)``.
    """

    state: State
    segments: Tensor  # int32 [B]: segments run since the row's last reset
    halted: Tensor  # bool [B]: the row finished; the next call restarts it
    current_data: Batch  # the rows each sequence is working on

    def to(self, device: torch.device | str) -> "ACTCarry":
        """A copy with every tensor on ``device``."""
        moved = {f.name: _map_tensors(getattr(self, f.name), lambda t: t.to(device)) for f in fields(self)}
        return replace(self, **moved)


torch.export.register_dataclass(ACTCarry)


def _map_tensors(
    value: Tensor | dict[str, Tensor], fn: Callable[[Tensor], Tensor]
) -> Tensor | dict[str, Tensor]:
    if isinstance(value, dict):
        return {k: fn(v) for k, v in value.items()}
    return fn(value)


def _where_rows(rows: Tensor, new: Tensor, old: Tensor) -> Tensor:
    """Take ``new`` in the rows where ``rows`` [B] is True, else ``old``; any trailing shape."""
    return torch.where(rows.view(-1, *([1] * (new.ndim - 1))), new, old)


class ACTModel(nn.Module):
    """Base class: runs one ACT segment per call and decides which rows halt.

    Subclasses set ``max_segments`` (int), ``halt_exploration_prob`` (float) and
    ``q_continue_target`` (bool) and implement the three hooks. ``segment`` returns the new
    state and ``{"logits", "q_halt_logits", "q_continue_logits"}``.
    """

    max_segments: int
    halt_exploration_prob: float
    q_continue_target: bool

    def empty_state(self, batch_size: int, device: torch.device) -> State:
        raise NotImplementedError

    def reset_state(self, state: State, rows: Tensor) -> State:
        raise NotImplementedError

    def segment(self, state: State, data: Batch) -> tuple[State, dict[str, Tensor]]:
        raise NotImplementedError

    def schedule(self, step: int) -> None:
        """Sets what depends on the training step (the training step calls it before each
        segment); a model with nothing scheduled keeps this no-op."""

    def initial_carry(self, batch: Batch) -> ACTCarry:
        """A carry with every row halted, so that the first call starts each row afresh."""
        inputs = batch["inputs"]
        size = inputs.shape[0]
        return ACTCarry(
            state=self.empty_state(size, inputs.device),
            segments=torch.zeros(size, dtype=torch.int32, device=inputs.device),
            halted=torch.ones(size, dtype=torch.bool, device=inputs.device),
            current_data={k: torch.zeros_like(v) for k, v in batch.items()},
        )

    def forward(self, carry: ACTCarry, batch: Batch) -> tuple[ACTCarry, dict[str, Tensor]]:
        restart = carry.halted  # [B]
        state = self.reset_state(carry.state, restart)
        data = {k: _where_rows(restart, v, carry.current_data[k]) for k, v in batch.items()}
        state, outputs = self.segment(state, data)
        with torch.no_grad():
            segments = torch.where(restart, 0, carry.segments) + 1
            halted = self._halt(segments, outputs)
            if self.training and self.q_continue_target and self.max_segments > 1:
                outputs["target_q_continue"] = self._q_continue_target(state, data, segments)
        state = {k: v.detach() for k, v in state.items()}
        return ACTCarry(state, segments, halted, data), outputs

    def _halt(self, segments: Tensor, outputs: dict[str, Tensor]) -> Tensor:
        """Eval: halt at the segment limit. Train: also when Q says so, unless exploring."""
        halted = segments >= self.max_segments
        if not self.training or self.max_segments == 1:
            return halted
        q_halt = outputs["q_halt_logits"]
        threshold = outputs["q_continue_logits"] if self.q_continue_target else 0
        halted = halted | (q_halt > threshold)
        explore = torch.rand_like(q_halt) < self.halt_exploration_prob  # [B]
        min_segments = explore * torch.randint_like(segments, low=2, high=self.max_segments + 1)
        return halted & (segments >= min_segments)

    def _q_continue_target(self, state: State, data: Batch, segments: Tensor) -> Tensor:
        """Bootstrapped target for Q-continue (HRM): sigmoid of the next segment's best Q value."""
        _, nxt = self.segment(state, data)
        best = torch.maximum(nxt["q_halt_logits"], nxt["q_continue_logits"])
        last = segments >= self.max_segments
        return torch.sigmoid(torch.where(last, nxt["q_halt_logits"], best))
