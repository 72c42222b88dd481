"""Hierarchical Reasoning Model (HRM): a fast low-level module L under a slow high-level module H.

Per ACT segment, with x the input embeddings [B, T, D] and f(s, u) = blocks(s + u):

    repeat h_cycles times:
        repeat l_cycles times:  z_L = L_level(z_L, z_H + x)
        z_H = H_level(z_H, z_L)

Only the very last z_L update and the last z_H update carry gradient (HRM's one-step gradient
approximation); everything before runs without it. The heads read z_H. HRM halts when
Q-halt > Q-continue and trains Q-continue on a bootstrapped target (``q_continue_target``).
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
class HRMConfig(RecurrentConfig):
    """HRM hyperparameters; defaults are the paper's 27M-parameter model."""

    name: Literal["hrm"] = "hrm"
    # ACT: halt on q_halt > q_continue, with the bootstrapped Q-continue target
    q_continue_target: bool = True
    # blocks in the high-level module
    h_layers: int = 4
    # blocks in the low-level module
    l_layers: int = 4
    # high-level updates per segment
    h_cycles: int = 2
    # low-level updates per high-level update
    l_cycles: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("h_layers", "l_layers", "h_cycles", "l_cycles"):
            require(getattr(self, key) >= 1, f"model.{key}={getattr(self, key)} must be >= 1")


class HRM(RecurrentModel):
    """HRM with the ACT interface: ``carry, outputs = model(carry, batch)``."""

    state_names = ("z_H", "z_L")
    output_state = "z_H"

    def __init__(self, config: HRMConfig, task: TaskSpec) -> None:
        super().__init__(config, task)
        self.H_level = self.make_stack(config.h_layers)
        self.L_level = self.make_stack(config.l_layers)

    def recur(self, state: State, x: Tensor, rope: Rope) -> State:
        z_H, z_L = state["z_H"], state["z_L"]  # [B, T, D] each
        h_cycles, l_cycles = self.config.h_cycles, self.config.l_cycles
        with torch.no_grad():
            for h_step in range(h_cycles):
                last = h_step == h_cycles - 1
                for _ in range(l_cycles - int(last)):
                    z_L = self.explore(self.L_level(z_L, z_H + x, rope))
                if not last:
                    z_H = self.explore(self.H_level(z_H, z_L, rope))
        z_L = self.explore(self.L_level(z_L, z_H + x, rope))  # the one-step gradient
        z_H = self.explore(self.H_level(z_H, z_L, rope))
        return {"z_H": z_H, "z_L": z_L}

    @property
    def stack_passes(self) -> int:
        """Passes of either module's stack (H and L are stacks of their own depths)."""
        return self.config.h_cycles * (self.config.l_cycles + 1)
