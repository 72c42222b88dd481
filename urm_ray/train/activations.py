"""Activation checkpointing of the looped blocks: memory for compute, applied outside the model.

A looped model runs its blocks many times per segment; every pass that keeps gradients keeps its
activations for the backward (about ``52 x hidden`` bytes per token per block under bf16). With
``train.activation_checkpointing`` each block keeps only its input and recomputes the rest in
the backward, one block at a time: about a third more compute for the passes with gradients, and
the activations of one block instead of all of them. Passes without gradients (TBPTL's truncated
loops, evaluation) run as before.

The block's ``forward`` is wrapped on the instance, so the parameter names (checkpoints, EMA,
the official weights) do not change. PyTorch's non-reentrant checkpoint restores the random
state for the recomputation, so a checkpointed step equals the plain one.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from urm_ray.models.layers import Block


def checkpoint_blocks(model: nn.Module) -> int:
    """Checkpoint every transformer block of ``model``; returns how many."""
    blocks = [module for module in model.modules() if isinstance(module, Block)]
    for block in blocks:
        block.forward = partial(_checkpointed, block.forward)  # type: ignore[method-assign]
    return len(blocks)


def _checkpointed(forward: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return forward(*args)
    return checkpoint(forward, *args, use_reentrant=False)
