"""What every puzzle task provides: the interface the registry (``tasks.registry``) holds.

A task is one module under ``data/tasks/`` (ARC: one folder) that ends with ``TASK = PuzzleTask(...)``:
its name (``metadata.json``'s ``task``), the ``urm-ray data <name>`` builder, its augmentation and
inverse, its verifier, and how it is evaluated. The rest of urm_ray asks the task, never its name.

    TASK = PuzzleTask("sudoku", add_builder=add_builder, augmentation="sudoku",
                      augment=augment, verifier=verifier)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from urm_ray.data.augment import TransformFn
from urm_ray.errors import ConfigError

# (answers, inputs, labels) numpy [N, L] -> [N] bool: the answer is a valid solution of the input
NumpyCheck = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
# seq_len -> the check for boards of that length; ConfigError for an impossible seq_len
VerifierFactory = Callable[[int], NumpyCheck]
# (answers, inputs, labels) numpy [N, L] -> [N, L]: the valid answer nearest to each answer (fewest
# differing supervised tokens, the label among equals), label-shaped (its ignored tokens kept)
NumpySearch = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
# (seq_len, vocab_size) -> the search for boards of that shape; ConfigError where it is too large
SearchFactory = Callable[[int, int], NumpySearch]
# adds the task's `urm-ray data` sub-command(s) to the `data` sub-parsers; each sets `func`
AddBuilder = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


@dataclass(frozen=True)
class PuzzleTask:
    """One puzzle task, as the data stream, the trainer, the evaluators and the CLI use it."""

    # metadata.json's "task"
    name: str
    add_builder: AddBuilder
    # the augmentation its datasets record in metadata.json ("none": the task has none)
    augmentation: str = "none"
    # rows -> invertible Transform, per row (None: no per-row augmentation; see `versioned`)
    augment: TransformFn | None = None
    # a verifier that needs no label: any valid answer passes (None: only the label is right)
    verifier: VerifierFactory | None = None
    # the valid answer nearest to an answer, by exhaustive search (None: the task has none); GRAM's
    # prior match can train towards it (``model.prior_match_targets: nearest``)
    nearest: SearchFactory | None = None
    # ARC: each augmented version of a whole task is its own puzzle. It has its own
    # puzzle-embedding row, versions are drawn per task without repeats and grids translate on
    # the canvas (`tasks.arc.augment`), and held-out evaluation votes over versions (pass@k,
    # `tasks.arc.evaluate`) instead of scoring one view.
    versioned: bool = False


def board_side(task: str, seq_len: int) -> int:
    """n for a square board of seq_len = n * n cells; ConfigError otherwise."""
    side = math.isqrt(seq_len)
    if side * side != seq_len:
        raise ConfigError(f"{task}: seq_len={seq_len} is not a square board")
    return side
