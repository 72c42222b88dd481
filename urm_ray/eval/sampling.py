"""Unconditional generation (``urm-ray sample``): boards drawn from an empty input, judged.

    drawn = sample_boards(model, meta, num=64, seed=0)    # model in eval mode (urm_ray.evaluate loads it)

A stochastic model (GRAM) draws ``num`` trajectories from its prior, all in one batch, starting
from the all-blank board; the task's verifier judges each sample. The report counts valid and
distinct samples, which is what a generator is for: valid, and not the same board every time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from urm_ray.data.store import DatasetMeta
from urm_ray.data.tasks.verify import verifier_for
from urm_ray.eval.heldout import generate_unconditional
from urm_ray.metrics import IGNORE
from urm_ray.models.registry import family_of

BLANK_TOKEN = 1  # the empty cell of the Sudoku and N-Queens datasets (0 is padding)


def sample_boards(model: nn.Module, meta: DatasetMeta, num: int, seed: int = 0) -> dict[str, Any]:
    """``num`` boards sampled from the blank input under ``seed``, with the fraction the task's
    verifier accepts and how many are distinct (ConfigError for a task without a verifier: ARC)."""
    verifier = verifier_for(meta.task, meta.seq_len)
    torch.manual_seed(seed)
    boards = generate_unconditional(model, num, BLANK_TOKEN)  # [N, L]
    blank = torch.full_like(boards, BLANK_TOKEN)
    valid = verifier(boards, blank, torch.full_like(boards, IGNORE)).cpu()  # [N] bool
    distinct = {tuple(b) for b in boards.tolist()}
    distinct_valid = {tuple(b) for b, ok in zip(boards.tolist(), valid.tolist()) if ok}
    return {
        "task": meta.task,
        "samples": num,
        "temperature": family_of(model).sample_temperature(model),
        "valid": float(valid.double().mean()),
        "distinct": len(distinct),
        "distinct_valid": len(distinct_valid),
        "boards": boards.tolist(),
    }
