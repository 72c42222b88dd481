"""Tiny Recursive Model (TRM): one small network refines a latent z_L and an answer state z_H.

Per ACT segment, with x the input embeddings [B, T, D] and net(s, u) = blocks(s + u):

    repeat h_cycles times:
        repeat l_cycles times:  z_L = net(z_L, z_H + x)
        z_H = net(z_H, z_L)
    all cycles but the last run without gradient; the last one backpropagates in full.

The heads read z_H. Unlike HRM the same weights update both states, and the puzzle vector sits
in a 16-position prefix by default (positions past the vector are zeros).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from urm_ray.models.act import State
from urm_ray.models.layers import Rope
from urm_ray.models.recurrent import RecurrentConfig, RecurrentModel, require
from urm_ray.models.task import TaskSpec


@dataclass
class TRMConfig(RecurrentConfig):
    """TRM hyperparameters; defaults are the paper's Sudoku/ARC attention model."""

    name: Literal["trm"] = "trm"
    # prefix positions in front of the tokens (TRM's default 16; 0 = ceil(dim / hidden))
    puzzle_emb_len: int = 16
    # blocks in the single shared network
    num_layers: int = 2
    # outer cycles (T); the first h_cycles - 1 run without gradient
    h_cycles: int = 3
    # z_L updates per cycle (n)
    l_cycles: int = 6

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.num_layers >= 1, f"model.num_layers={self.num_layers} must be >= 1")
        require(self.h_cycles >= 1, f"model.h_cycles={self.h_cycles} must be >= 1")
        require(self.l_cycles >= 1, f"model.l_cycles={self.l_cycles} must be >= 1")


class TRM(RecurrentModel):
    """TRM with the ACT interface: ``carry, outputs = model(carry, batch)``."""

    state_names = ("z_H", "z_L")
    output_state = "z_H"

    def __init__(self, config: TRMConfig, task: TaskSpec) -> None:
        super().__init__(config, task)
        self.net = self.make_stack(config.num_layers)

    def cycle(self, z_H: Tensor, z_L: Tensor, x: Tensor, rope: Rope) -> tuple[Tensor, Tensor]:
        """l_cycles latent updates, then one answer update."""
        for _ in range(self.config.l_cycles):
            z_L = self.explore(self.net(z_L, z_H + x, rope))
        return self.explore(self.net(z_H, z_L, rope)), z_L

    def recur(self, state: State, x: Tensor, rope: Rope) -> State:
        z_H, z_L = state["z_H"], state["z_L"]  # [B, T, D] each
        with torch.no_grad():
            for _ in range(self.config.h_cycles - 1):
                z_H, z_L = self.cycle(z_H, z_L, x, rope)
        z_H, z_L = self.cycle(z_H, z_L, x, rope)
        return {"z_H": z_H, "z_L": z_L}

    @property
    def stack_passes(self) -> int:
        return self.config.h_cycles * (self.config.l_cycles + 1)
