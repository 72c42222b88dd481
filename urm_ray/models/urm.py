"""Universal Reasoning Model (URM): one weight-shared block stack looped M times per ACT segment.

Per segment, with h the carried state and x the input embeddings [B, T, D]:

    repeat M (= loops) times:  h = stack(h + x)      # the input is re-injected before every pass
    the first N (= truncation) passes run without gradient (truncated backprop through loops)

then logits = lm_head(h) on the token positions and Q = q_head(h[:, 0]). The official code
writes the loop as H_cycles * L_cycles passes with the first (H_cycles - 1) * L_cycles
forward-only, i.e. M = H*L and N = (H-1)*L; any N < M is allowed here. The official ``loops``
key is the ACT segment limit, called ``max_segments`` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from urm_ray.models.act import State
from urm_ray.models.layers import FFNKind, Rope
from urm_ray.models.recurrent import RecurrentConfig, RecurrentModel, require
from urm_ray.models.task import TaskSpec


@dataclass
class URMConfig(RecurrentConfig):
    """URM hyperparameters; defaults are the paper's 4-layer, 512-wide model."""

    name: Literal["urm"] = "urm"
    # MLP kind: URM's ConvSwiGLU (short causal conv) or plain SwiGLU (ablation)
    ffn: FFNKind = "conv_swiglu"
    # blocks in the shared stack
    num_layers: int = 4
    # M: passes of the block stack per ACT segment
    loops: int = 8
    # N: the first N passes run forward-only (TBPTL); must be < loops
    truncation: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.num_layers >= 1, f"model.num_layers={self.num_layers} must be >= 1")
        require(self.loops >= 1, f"model.loops={self.loops} must be >= 1")
        require(
            0 <= self.truncation < self.loops,
            f"model.truncation={self.truncation} must be >= 0 and < model.loops={self.loops}",
        )


class URM(RecurrentModel):
    """URM with the ACT interface: ``carry, outputs = model(carry, batch)``."""

    state_names = ("hidden",)
    output_state = "hidden"

    def __init__(self, config: URMConfig, task: TaskSpec) -> None:
        super().__init__(config, task)
        self.blocks = self.make_stack(config.num_layers)

    def recur(self, state: State, x: Tensor, rope: Rope) -> State:
        h = state["hidden"]  # [B, T, D]
        with torch.no_grad():
            for _ in range(self.config.truncation):
                h = self.explore(self.blocks(h, x, rope))
        for _ in range(self.config.loops - self.config.truncation):
            h = self.explore(self.blocks(h, x, rope))
        return {"hidden": h}

    @property
    def stack_passes(self) -> int:
        return self.config.loops
