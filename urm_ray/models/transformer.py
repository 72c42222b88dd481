"""Plain (non-looped) Transformer baseline: num_layers blocks applied once per ACT segment.

Same embedding, blocks and heads as the recurrent families, so comparisons isolate the effect of
looping. Per segment, with x the input embeddings [B, T, D] and h the carried state:

    h = blocks(h + x)        # every pass carries gradient; nothing is truncated

The state starts at zeros, so with ``max_segments = 1`` (the default) a segment is exactly
``blocks(x)``, a plain feed-forward Transformer. With more segments ACT re-injects the previous
segment's output (gradients never cross segments), which is URM with loops=1.
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
class TransformerConfig(RecurrentConfig):
    """Baseline hyperparameters; defaults match HRM's total depth (2 x 4 blocks) at width 512."""

    name: Literal["transformer"] = "transformer"
    # blocks, each with its own weights
    num_layers: int = 8
    # ACT: one segment, i.e. one forward pass per example
    max_segments: int = 1
    # one segment leaves no minimum number of segments to explore
    halt_exploration_prob: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.num_layers >= 1, f"model.num_layers={self.num_layers} must be >= 1")


class Transformer(RecurrentModel):
    """The baseline with the ACT interface: ``carry, outputs = model(carry, batch)``."""

    state_names = ("hidden",)
    output_state = "hidden"

    def __init__(self, config: TransformerConfig, task: TaskSpec) -> None:
        super().__init__(config, task)
        self.blocks = self.make_stack(config.num_layers)
        with torch.no_grad():
            self.init_hidden.zero_()  # a fresh row computes blocks(x), with no random offset

    def recur(self, state: State, x: Tensor, rope: Rope) -> State:
        return {"hidden": self.blocks(state["hidden"], x, rope)}
