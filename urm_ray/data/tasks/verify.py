"""Task verifiers on predicted token boards, by dataset task name (``metadata.json``'s ``task``).

A verifier maps answers [N, L] (token ids, any device) to [N] bool on the same device: True when
the board is a valid solution of the task, whichever solution it is. Uses: GRAM's halting target
(``model.halt_target: verifier``) and the coverage / validity counts of sampled evaluation.

    accepts = verifier_for("nqueens", seq_len=36)
    ok = accepts(logits.argmax(-1))             # [B] bool

ARC has one right answer per input, so its verifier needs the label: ``arc_exact_match(answers,
labels)``, the ARC rule (the cropped grid equals the true grid in shape and every colour).
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


def arc_exact_match(answers: Tensor, labels: Tensor) -> Tensor:
    """[N] bool: each predicted ARC canvas [N, 900] (cropped as the official evaluator does)
    holds exactly the grid of its label canvas [N, 900] (stored form, ignore label = PAD)."""
    from urm_ray.data import arc_augment

    got = arc_augment.crop_canonical(answers.detach().cpu().numpy())
    want = arc_augment.canonical(labels.detach().cpu().numpy())
    return torch.from_numpy((got == want).all(axis=1)).to(answers.device)


def verifier_for(task: str, seq_len: int) -> Verifier:
    """The verifier of ``task`` for boards of ``seq_len`` tokens; ConfigError if there is none."""
    if task == "arc":
        raise ConfigError("task 'arc' has one answer per input: check answers against the labels"
                          " with arc_exact_match(answers, labels)")
    if task not in VERIFIERS:
        raise ConfigError(f"task {task!r} has no verifier; expected one of {sorted(VERIFIERS)}")
    side = _board_side(task, seq_len)
    return _on_numpy(lambda boards: VERIFIERS[task](boards, side))


VERIFIERS: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "nqueens": nqueens.valid_queens_mask,
    # sudoku tokens are digit + 1 (blank 1 = digit 0, which no valid board contains)
    "sudoku": lambda boards, n: sudoku.valid_solutions_mask(boards.astype(np.int64) - 1, n),
}
