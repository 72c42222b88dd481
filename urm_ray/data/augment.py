"""On-the-fly augmentations, deterministic per (puzzle_index, aug_index, seed), vectorised.

Randomness is counter-based: each row's 64-bit key is a hash of (seed, puzzle_index, aug_index),
and every random choice of that row hashes the key with a draw counter. The same row therefore gets
the same augmentation in any batch, block, worker or epoch, with no RNG state to carry. Augmentation
index 0 is always the original puzzle.

A task's augmentation (its module's ``augment``, named in the registry) is a function
`(inputs [B, L], labels [B, L], keys [B] uint64) -> Transform`: cells moved, then tokens renamed,
both permutations, so every augmented row maps back (`invert_batch`). This module holds the
shared parts: the keyed randomness, `Transform`, and the dihedral symmetries of square grids.
ARC augments whole tasks instead (`urm_ray.data.tasks.arc.augment`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from urm_ray.errors import DataError

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def row_keys(puzzle_index: np.ndarray, aug_index: np.ndarray, seed: int) -> np.ndarray:
    """[B] uint64 key of each (puzzle_index, aug_index) row under `seed`."""
    key = _splitmix64(np.full(np.shape(puzzle_index), seed, dtype=np.uint64))
    key = _splitmix64(key ^ np.asarray(puzzle_index).astype(np.uint64))
    return _splitmix64(key ^ np.asarray(aug_index).astype(np.uint64))


def mix(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """[B] uint64 key of each (key, value) row: a keyed hash of the values."""
    return _splitmix64(keys ^ _splitmix64(np.asarray(values).astype(np.uint64)))


def random_bits(keys: np.ndarray, count: int, salt: int) -> np.ndarray:
    """[B, count] uint64 pseudo-random words of each row; `salt` separates independent draws."""
    counters = np.arange(count, dtype=np.uint64) + np.uint64(salt) * np.uint64(1 << 32)  # [count]
    return _splitmix64(keys[:, None] ^ _splitmix64(counters)[None, :])


def random_permutations(keys: np.ndarray, size: int, salt: int) -> np.ndarray:
    """[B, size] int64: a random permutation of range(size) per row."""
    return np.argsort(random_bits(keys, size, salt), axis=1)


def gather_cells(seq: np.ndarray, src: np.ndarray) -> np.ndarray:
    """[B, L]: output cell i of each row takes the row's cell src[b, i]."""
    return np.take_along_axis(seq, src, axis=1)


def relabel(seq: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """Maps tokens through per-row lookup tables [B, V]; negative (ignored) labels are kept."""
    mapped = np.take_along_axis(lut, np.clip(seq, 0, lut.shape[1] - 1).astype(np.int64), axis=1)
    return np.where(seq >= 0, mapped, seq).astype(seq.dtype)


@dataclass(frozen=True)
class Transform:
    """A per-row augmentation as data: cells move, then tokens are renamed. Both are
    permutations, so the transform inverts exactly (predictions map back to the original puzzle).

    src [B, L] int64: the source cell of each output cell; lut [B, V] int64 or None: the new token
    of each token (None: tokens kept). Tokens at or above V and negative labels are kept."""

    src: np.ndarray
    lut: np.ndarray | None = None

    def apply(self, seq: np.ndarray) -> np.ndarray:
        moved = gather_cells(seq, self.src)
        return moved if self.lut is None else relabel(moved, self.lut)

    def invert(self, seq: np.ndarray) -> np.ndarray:
        """The rows whose `apply` is `seq`."""
        named = seq if self.lut is None else relabel(seq, np.argsort(self.lut, axis=1))
        return gather_cells(named, np.argsort(self.src, axis=1))


# (inputs [B, L], labels [B, L], keys [B] uint64) -> the rows' transform
TransformFn = Callable[[np.ndarray, np.ndarray, np.ndarray], Transform]


def dihedral_sources(n: int) -> np.ndarray:
    """[8, n*n] int64: for each of the 8 symmetries of the n x n square, the source cell of every
    output cell (row-major). Index 0 is the identity, 1-3 rotate by 90/180/270 degrees, 4 is the
    transpose and 5-7 the transpose followed by those rotations."""
    cells = np.arange(n * n).reshape(n, n)
    views = [np.rot90(cells, k) for k in range(4)]
    views += [np.rot90(cells.T, k) for k in range(4)]
    return np.stack([v.reshape(-1) for v in views])


def dihedral(inputs: np.ndarray, labels: np.ndarray, keys: np.ndarray) -> Transform:
    """One of the 7 non-identity symmetries of the square grid per row, the same for input and
    label (mazes: walls, start, goal and path move together; a shortest path stays shortest)."""
    seq_len = inputs.shape[1]
    n = math.isqrt(seq_len)
    if n * n != seq_len:
        raise DataError(f"dihedral augmentation: seq_len={seq_len} is not a square grid")
    transform = 1 + (random_bits(keys, 1, salt=11)[:, 0] % np.uint64(7)).astype(np.int64)  # [B]
    return Transform(dihedral_sources(n)[transform])  # [B, L]


def row_transforms(fn: TransformFn, inputs: np.ndarray, labels: np.ndarray, puzzle_index: np.ndarray,
                   aug_index: np.ndarray, seed: int) -> tuple[np.ndarray, Transform | None]:
    """(rows with aug_index > 0, their transform; None when there are none)."""
    rows = np.flatnonzero(np.asarray(aug_index) != 0)
    if len(rows) == 0:
        return rows, None
    keys = row_keys(puzzle_index[rows], aug_index[rows], seed)  # [R]
    return rows, fn(inputs[rows], labels[rows], keys)


def augment_batch(fn: TransformFn, inputs: np.ndarray, labels: np.ndarray,
                  puzzle_index: np.ndarray, aug_index: np.ndarray, seed: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Rows [B, L] through a task's augmentation `fn`; rows with aug_index 0 are returned unchanged."""
    rows, transform = row_transforms(fn, inputs, labels, puzzle_index, aug_index, seed)
    if transform is None:
        return inputs, labels
    inputs, labels = inputs.copy(), labels.copy()
    inputs[rows], labels[rows] = transform.apply(inputs[rows]), transform.apply(labels[rows])
    return inputs, labels


def invert_batch(fn: TransformFn, answers: np.ndarray, inputs: np.ndarray, labels: np.ndarray,
                 puzzle_index: np.ndarray, aug_index: np.ndarray, seed: int) -> np.ndarray:
    """Answers [B, L] to augmented rows mapped back onto their original puzzles; ``inputs`` and
    ``labels`` are the original (stored) rows the augmentation was drawn from."""
    rows, transform = row_transforms(fn, inputs, labels, puzzle_index, aug_index, seed)
    if transform is None:
        return answers
    answers = answers.copy()
    answers[rows] = transform.invert(answers[rows])
    return answers
