"""``train.compile``: which part of the training and evaluation step torch.compile compiles.

    if compile_enabled(cfg.train.compile, device):
        compile_model(model)                # the segment core, in place
        objective = objective.compiled()    # the objective's tensor part (objectives.py)

What is compiled has static shapes: a family's ``core`` (the recurrence, the heads, GRAM's
guidance and KL) and the objective's loss. What stays eager is small and value-dependent: the
puzzle-embedding lookup (a fresh leaf tensor per step for the sign-SGD optimizer), the ACT
reset / halting / exploration, and the optimizers. ``dynamic=False`` gives one graph per
(shape, grad mode, train/eval): the training step, the no-grad passes HRM's Q-target runs, and
evaluation at its batch size (plus the last, smaller eval batch). Shapes repeat from step to
step, so nothing recompiles after the first steps.

Default ``auto``: on for CUDA, off for CPU. On this project's 2-core CPU the compiled step is
faster (see the README), but compiling costs tens of seconds per process, more than a short
CPU run saves; a long CPU run sets ``train.compile=true``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

CompileSetting = bool | Literal["auto"]


def compile_enabled(setting: CompileSetting, device: torch.device) -> bool:
    """Whether to compile: ``auto`` means on CUDA only."""
    return device.type == "cuda" if setting == "auto" else bool(setting)


def compile_model(model: nn.Module) -> nn.Module:
    """Replace ``model.core`` by its compiled version, in place; returns the model."""
    model.core = torch.compile(model.core, dynamic=False)
    return model

