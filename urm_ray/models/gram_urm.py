"""GRAM's Gaussian guidance on URM's core (``model.name: gram_urm``): a stochastic looped transformer.

URM's segment is M (= loops) passes of one weight-shared stack, the first N (= truncation) without
gradient. Here every pass is one GRAM transition of the state h, with x the input embeddings:

    u = stack(h + x)                   # deterministic proposal
    h = u + noise_scale * proj(eps)    # eps from the posterior q(eps | u, y) in training, else the prior

The N forward-only passes are GRAM's no-gradient transitions (their KL trains only the heads,
with ``kl_transitions: all``); the last M - N passes carry gradient, and so does their KL. Every
other choice is GRAM's (`urm_ray.models.gram`): the KL reduction, balance and coefficient, the
prior-guided Q-halt decode, and ``noise_scale: 0``, which leaves exactly URM.

Why: on unique-solution puzzles the prior cannot beat its deterministic core, and URM's core
learns 4x4 Sudoku far faster than TRM's at the same size (docs/models.md, "How they compare on a CPU").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch
from torch import Tensor

from urm_ray.models.act import State
from urm_ray.models.gram import GuidanceConfig, Guided
from urm_ray.models.layers import Rope
from urm_ray.models.urm import URM, URMConfig


@dataclass
class GRAMURMConfig(URMConfig, GuidanceConfig):
    """URM's core (num_layers, loops = M, truncation = N, ffn) plus GRAM's guidance."""

    name: Literal["gram_urm"] = "gram_urm"  # type: ignore[assignment]

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_guidance()


class GRAMURM(Guided, URM):
    """GRAM on URM with the ACT interface: ``carry, outputs = model(carry, batch)``."""

    def core(self, state: State, x: Tensor, labels: Tensor) -> tuple[State, dict[str, Tensor]]:
        if self.noise_scale == 0:
            return super().core(state, x, labels)
        rope = self.rope(x.shape[1])
        target = self.training_target(labels, x)
        kls: list[Tensor] = []  # per-row balanced KL [B] of each charged transition
        h, u = self.transitions(state["hidden"], x, rope, target, kls)
        outputs = self.guided_outputs(h, u, target, kls, labels)
        if target is not None and self.prior_match_on:
            outputs.update(self.prior_match_outputs(self.transitions(state["hidden"], x, rope, None, [])[0]))
        return {"hidden": h}, outputs

    def transitions(self, h: Tensor, x: Tensor, rope: Rope, target: Optional[Tensor],
                    kls: list[Tensor]) -> tuple[Tensor, Tensor]:
        """One segment's guided passes from h [B, T, D]: posterior-guided with a target, else the
        prior; returns the last state and the last proposal."""
        for _ in range(self.config.truncation):
            with torch.no_grad():
                u = self.blocks(h, x, rope)
            h = self.free_transition(u, target, kls)
        for _ in range(self.config.loops - self.config.truncation):
            u = self.blocks(h, x, rope)
            h = self.graded_transition(u, target, kls)
        return h, u
