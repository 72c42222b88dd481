"""Task verifiers on predicted token boards, by dataset task name (``metadata.json``'s ``task``).

A verifier maps (answers, inputs, labels), each [N, L] token ids on any device, to [N] bool on the
answers' device: True when the answer is a valid solution of the input, whichever solution it is.
Tasks read what they need: Sudoku, N-Queens, colouring and maze check the answer against the
rules and the input's givens; the labels are for tasks scored by exact match. Uses: GRAM's
halting target (``model.halt_target: verifier``) and the validity / coverage counts of sampled
evaluation.

    accepts = verifier_for("maze", seq_len=900)
    ok = accepts(logits.argmax(-1), batch["inputs"], batch["labels"])     # [B] bool

ARC has one right answer per input, so its verifier needs the label: ``arc_exact_match(answers,
labels)``, the ARC rule (the cropped grid equals the true grid in shape and every colour).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from urm_ray.data.tasks import coloring, maze, nqueens, sudoku
from urm_ray.errors import ConfigError

Verifier = Callable[[Tensor, Tensor, Tensor], Tensor]
# (answers, inputs, labels) numpy [N, L] -> [N] bool
NumpyCheck = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _board_side(task: str, seq_len: int) -> int:
    side = math.isqrt(seq_len)
    if side * side != seq_len:
        raise ConfigError(f"{task}: seq_len={seq_len} is not a square board")
    return side


def _on_numpy(check: NumpyCheck) -> Verifier:
    def verify(answers: Tensor, inputs: Tensor, labels: Tensor) -> Tensor:
        arrays = (t.detach().cpu().numpy() for t in (answers, inputs, labels))
        ok = check(*arrays)
        return torch.from_numpy(np.asarray(ok, dtype=bool)).to(answers.device)

    return verify


def _sudoku(seq_len: int) -> NumpyCheck:
    n = _board_side("sudoku", seq_len)

    def check(answers: np.ndarray, inputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
        # tokens are digit + 1: blank 1 = digit 0, which no valid board contains
        givens = inputs > sudoku.BLANK_TOKEN
        keeps = np.where(givens, answers == inputs, True).all(axis=1)
        return keeps & sudoku.valid_solutions_mask(answers.astype(np.int64) - 1, n)

    return check


def _nqueens(seq_len: int) -> NumpyCheck:
    n = _board_side("nqueens", seq_len)

    def check(answers: np.ndarray, inputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
        givens = inputs == nqueens.QUEEN_TOKEN  # empty inputs (unconditional) give nothing
        keeps = np.where(givens, answers == nqueens.QUEEN_TOKEN, True).all(axis=1)
        return keeps & nqueens.valid_queens_mask(answers, n)

    return check


def _maze(seq_len: int) -> NumpyCheck:
    n = _board_side("maze", seq_len)
    # the label's path length is the shortest length (builders check it), which spares a BFS
    return lambda answers, inputs, labels: maze.valid_paths_mask(answers, inputs, n, labels)


def _coloring(seq_len: int) -> NumpyCheck:
    n = coloring.num_nodes(seq_len)
    return lambda answers, inputs, labels: coloring.valid_colorings_mask(answers, inputs, n)


# task -> (seq_len -> numpy check); the factory raises ConfigError for an impossible seq_len
VERIFIERS: dict[str, Callable[[int], NumpyCheck]] = {
    "sudoku": _sudoku,
    "nqueens": _nqueens,
    "maze": _maze,
    "coloring": _coloring,
}


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
    return _on_numpy(VERIFIERS[task](seq_len))


def optional_verifier(task: str, seq_len: int) -> Verifier | None:
    """``task``'s verifier, or None where it has none (answers then count as valid only when
    they equal the label)."""
    return verifier_for(task, seq_len) if task in VERIFIERS else None
