"""Unconditional generation from a checkpoint (``urm-ray sample``): boards from an empty input.

    urm-ray sample runs/nqueens8-gram/checkpoint_000002 --num 64

A stochastic model (GRAM) draws ``num`` trajectories from its prior, all in one batch, starting
from the all-blank board; the task's verifier judges each sample. The report counts valid and
distinct samples, which is what a generator is for: valid, and not the same board every time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from urm_ray.data import stream
from urm_ray.data.tasks.verify import verifier_for
from urm_ray.errors import DataError
from urm_ray.eval.heldout import IGNORE, generate_unconditional
from urm_ray.eval.offline import load_checkpoint
from urm_ray.models.registry import family_of

BLANK_TOKEN = 1  # the empty cell of the Sudoku and N-Queens datasets (0 is padding)


def sample_checkpoint(folder: str | Path, num: int, seed: int = 0,
                      temperature: Optional[float] = None) -> dict[str, Any]:
    """``num`` boards sampled from the blank input, with their validity and distinctness; a
    ``temperature`` replaces the checkpoint's ``model.sample_temperature`` (GRAM only)."""
    if num < 1:
        raise DataError(f"--num {num}: expected at least 1 sample")
    cfg, model = load_checkpoint(folder, temperature)
    meta = stream.load_meta(cfg.data)
    verifier = verifier_for(meta.task, meta.seq_len)  # ConfigError for tasks without one (ARC)
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
