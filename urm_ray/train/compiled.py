"""``train.compile``: which part of the training and evaluation step torch.compile compiles.

    if compile_enabled(cfg.train.compile, device):
        compile_model(model)                # the segment core, in place
        objective = objective.compiled()    # the objective's tensor part (objectives.py)

What is compiled: a family's ``core`` (the recurrence, the heads, GRAM's guidance and KL) and the
objective's loss. What stays eager is small and value-dependent: the puzzle-embedding lookup (a
fresh leaf tensor per step for the sign-SGD optimizer), the ACT reset / halting / exploration,
and the optimizers. No part of it reads a value back to the host (tests/test_step_syncs.py).

Shapes: one graph per shape, and no more shapes than these.

- Training is static (``dynamic=False``): its batch never changes, so one graph per grad mode
  (the step, the no-grad passes HRM's Q-target runs), and one more where the graph reads a
  setting that a schedule turns (GRAM's prior match from ``prior_match_start``).
- Evaluation (the model in eval mode) marks the batch dimension dynamic: the last, partial eval
  batch, GRAM's K x B sampled rows and test-time width N x B all run one graph, where static
  shapes would compile one per size and, past ``recompile_limit`` sizes, fall back to eager
  without a word. Padding the last batch to the fixed size would keep evaluation static, but
  every count of the evaluators would then need a mask of padded rows. A batch of one row is
  still its own graph (Dynamo specialises size 1). Settings the core reads in Python (test-time
  ``loops`` and ``noise``, GRAM's sampling temperature) make one graph each.

Inside DDP (several workers), the compiled core stays one graph: Dynamo's DDP optimizer is off
(``optimize_ddp=False``). That optimizer splits the graph where a gradient bucket's parameters
are first used, so that a bucket's all-reduce starts while the backward of earlier layers still
runs. A looped model shares its block's weights across every loop, so no bucket's gradient is
complete before the backward of the first loop, at the end: the split overlaps nothing and only
cuts the graph into pieces (at the no-grad truncation loop too, where the shared weights are
first used), and it refuses DDP buckets smaller than its first bucket. With it off, DDP's own
reducer all-reduces the gradients as the one backward graph hands them over; the all-reduce
averages exactly as eager DDP does (tests/test_ddp_compile.py).

A fallback is loud: ``compile_model`` sets Dynamo's ``fail_on_recompile_limit_hit``, so a
function that recompiles past ``recompile_limit`` raises instead of running eagerly from then on.
A process that builds many models one after the other (a reused Tune trial actor) resets Dynamo
between them (``reset_compiled``), or their graphs would add up to that limit.

Default ``auto``: on for CUDA, off for CPU. On this project's 2-core CPU the compiled step is
faster (see the README), but compiling costs tens of seconds per process, more than a short
CPU run saves; a long CPU run sets ``train.compile=true``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch  # torch._dynamo loads on first use: seconds that a step never compiled need not pay
from torch import Tensor, nn

CompileSetting = bool | Literal["auto"]


def compile_enabled(setting: CompileSetting, device: torch.device) -> bool:
    """Whether to compile: ``auto`` means on CUDA only."""
    return device.type == "cuda" if setting == "auto" else bool(setting)


def compile_model(model: nn.Module) -> nn.Module:
    """Replace ``model.core`` by its compiled version, in place; returns the model. In eval mode
    the batch dimension of the core's tensors is marked dynamic (one graph for every eval batch)."""
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    torch._dynamo.config.optimize_ddp = False  # one graph inside DDP too (see the module docstring)
    compiled = torch.compile(model.core, dynamic=False)

    def core(state: dict[str, Tensor], x: Tensor, labels: Tensor) -> Any:
        if not model.training:
            for tensor in (*state.values(), x, labels):
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
        return compiled(state, x, labels)

    model.core = core
    return model


def reset_compiled() -> None:
    """Forget every compiled graph of this process (before a new model compiles its own)."""
    torch._dynamo.reset()

