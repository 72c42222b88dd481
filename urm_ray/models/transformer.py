"""Plain (non-looped) Transformer baseline: URM with one pass per segment and separate blocks.

A configuration of URM (``loops = 1``, ``truncation = 0``, plain SwiGLU, 8 blocks, one ACT
segment), so the comparison isolates looping and ConvSwiGLU. Per segment, with x the input
embeddings [B, T, D] and h the carried state:

    h = blocks(h + x)        # every pass carries gradient; nothing is truncated

The state starts at zeros (URM starts from a random offset), so with ``max_segments = 1`` (the
default) a segment is exactly ``blocks(x)``, a plain feed-forward Transformer. With more segments
ACT re-injects the previous segment's output (gradients never cross segments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from urm_ray.models.layers import FFNKind
from urm_ray.models.recurrent import require
from urm_ray.models.task import TaskSpec
from urm_ray.models.urm import URM, URMConfig


@dataclass
class TransformerConfig(URMConfig):
    """Baseline hyperparameters; defaults match HRM's total depth (2 x 4 blocks) at width 512."""

    name: Literal["transformer"] = "transformer"  # type: ignore[assignment]
    ffn: FFNKind = "swiglu"  # MLP kind: plain SwiGLU (the baseline) or URM's ConvSwiGLU
    # blocks, each with its own weights, applied once
    num_layers: int = 8
    loops: int = 1  # passes of the block stack per segment: must be 1 (looping it is model.name: urm)
    truncation: int = 0  # forward-only passes: 0, the one pass carries gradient
    # ACT: one segment, i.e. one forward pass per example
    max_segments: int = 1
    # one segment leaves no minimum number of segments to explore
    halt_exploration_prob: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.loops == 1, f"model.loops={self.loops}: the transformer makes one pass per "
                                 "segment; looping the stack is model.name=urm")


class Transformer(URM):
    """The baseline with the ACT interface: ``carry, outputs = model(carry, batch)``."""

    def __init__(self, config: TransformerConfig, task: TaskSpec) -> None:
        super().__init__(config, task)
        with torch.no_grad():
            self.init_hidden.zero_()  # a fresh row computes blocks(x), with no random offset
