"""Task verifiers on predicted token boards, by dataset task name (``metadata.json``'s ``task``).

A verifier maps answers [N, L] (token ids, any device) to [N] bool on the same device: True when
the board is a valid solution of the task, whichever solution it is. Uses: GRAM's halting target
(``model.halt_target: verifier``) and the coverage / validity counts of sampled evaluation.

    accepts = verifier_for("nqueens", seq_len=36)
    ok = accepts(logits.argmax(-1))             # [B] bool
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from urm_ray.data.tasks import nqueens, sudoku
from urm_ray.errors import ConfigError

Verifier = Callable[[Tensor], Tensor]


def _board_side(task: str, seq_len: int) -> int:
    side = math.isqrt(seq_len)
    if side * side != seq_len:
        raise ConfigError(f"{task}: seq_len={seq_len} is not a square board")
    return side


def _on_numpy(check: Callable[[np.ndarray], np.ndarray]) -> Verifier:
    def verify(answers: Tensor) -> Tensor:
        ok = check(answers.detach().cpu().numpy())
        return torch.from_numpy(np.asarray(ok, dtype=bool)).to(answers.device)

    return verify


def verifier_for(task: str, seq_len: int) -> Verifier:
    """The verifier of ``task`` for boards of ``seq_len`` tokens; ConfigError if there is none."""
    if task not in VERIFIERS:
        raise ConfigError(f"task {task!r} has no verifier; expected one of {sorted(VERIFIERS)}")
    side = _board_side(task, seq_len)
    return _on_numpy(lambda boards: VERIFIERS[task](boards, side))


def optional_verifier(task: str, seq_len: int) -> Verifier | None:
    """``task``'s verifier, or None where it has none (sampled answers then count as valid only
    when they equal the label)."""
    return verifier_for(task, seq_len) if task in VERIFIERS else None


VERIFIERS: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "nqueens": nqueens.valid_queens_mask,
    # sudoku tokens are digit + 1 (blank 1 = digit 0, which no valid board contains)
    "sudoku": lambda boards, n: sudoku.valid_solutions_mask(boards.astype(np.int64) - 1, n),
}
