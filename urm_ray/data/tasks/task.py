"""What every puzzle task provides: the interface the registry (``tasks.registry``) holds.

A task is one module under ``data/tasks/`` (ARC: one folder) that ends with ``TASK = PuzzleTask(...)``:
its name (``metadata.json``'s ``task``), the ``urm-ray data <name>`` builder, its augmentation and
inverse, its verifier, and how it is evaluated. The rest of urm_ray asks the task, never its name.

    TASK = PuzzleTask("sudoku", add_builder=add_builder, augmentation="sudoku",
                      augment=augment, verifier=verifier)

A task whose augmented versions are puzzles of their own (ARC) also gives `Versions` (how the
stream draws them, how many puzzle-embedding rows they take) and `Scoring` (its held-out score by
voting over views, and the prefix of that score's metric names); the other tasks leave both None
and are streamed row by row and scored on one view.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
# (dataset folder, K slots per task) -> what `Versions.augment` needs of that dataset, read once on
# the driver and shipped to the stream's map tasks
PrepareVersions = Callable[[str, int], Any]
# (inputs [N, L], labels [N, L], task identifiers [N], puzzle_index [N], aug_index [N], seed,
#  prepared, K, translate) -> (inputs [N, L], labels [N, L], version identifiers [N])
AugmentVersions = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]
# (task identifiers [N], aug_index [N], K) -> [N] the identifiers of those versions
VersionIdentifiers = Callable[[np.ndarray, np.ndarray, int], np.ndarray]
# (model, data config, split, views, batch_size, max_rows, device, ranks, gather, halt_early,
#  pass_ks, live) -> {"metrics": {prefix + name: value}, ...}: the task's held-out report
ScoreFn = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class Versions:
    """Augmented versions of a whole task as puzzles of their own: each version has its own
    puzzle-embedding row, the stream applies a block of aug indices to every stored row (versions
    drawn per task without repeats), and held-out rows read as version 0."""

    prepare: PrepareVersions
    augment: AugmentVersions
    identifiers: VersionIdentifiers
    # (identifiers in metadata.json, K) -> rows of the puzzle-embedding table
    table_rows: Callable[[int, int], int]
    translates: bool = False  # grids are moved on the canvas in training (data.translate)


@dataclass(frozen=True)
class Scoring:
    """A task's own held-out score, by voting over augmented views of each test input: what
    `urm-ray eval` reports for it, and what a run adds at each evaluation with eval.views."""

    prefix: str  # the score's metric names start with it ("arc/")
    score: ScoreFn
    pass_ks: tuple[int, ...]  # the k of pass@k reported by default


@dataclass(frozen=True)
class PuzzleTask:
    """One puzzle task, as the data stream, the trainer, the evaluators and the CLI use it."""

    # metadata.json's "task"
    name: str
    add_builder: AddBuilder
    # the augmentation its datasets record in metadata.json ("none": the task has none)
    augmentation: str = "none"
    # rows -> invertible Transform, per row (None: no per-row augmentation; see `versions`)
    augment: TransformFn | None = None
    # a verifier that needs no label: any valid answer passes (None: only the label is right)
    verifier: VerifierFactory | None = None
    # the valid answer nearest to an answer, by exhaustive search (None: the task has none); GRAM's
    # prior match can train towards it (``model.prior_match_targets: nearest``)
    nearest: SearchFactory | None = None
    # augmented versions of a whole task as puzzles of their own (None: rows augmented one by one)
    versions: Versions | None = None
    # the task's own held-out score over augmented views (None: the plain score of one view)
    scoring: Scoring | None = None

    def embedding_rows(self, num_identifiers: int, slots: int) -> int:
        """Rows of the model's puzzle-embedding table for a dataset with ``num_identifiers``
        identifiers streamed with ``slots`` aug indices per puzzle."""
        if self.versions is None:
            return num_identifiers
        return self.versions.table_rows(num_identifiers, slots)

    @property
    def translates(self) -> bool:
        """Training moves this task's grids on the canvas (data.translate)."""
        return self.versions is not None and self.versions.translates


def board_side(task: str, seq_len: int) -> int:
    """n for a square board of seq_len = n * n cells; ConfigError otherwise."""
    side = math.isqrt(seq_len)
    if side * side != seq_len:
        raise ConfigError(f"{task}: seq_len={seq_len} is not a square board")
    return side
