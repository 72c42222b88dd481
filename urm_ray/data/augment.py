"""On-the-fly augmentations, deterministic per (puzzle_index, aug_index, seed), vectorised.

Randomness is counter-based: each row's 64-bit key is a hash of (seed, puzzle_index, aug_index),
and every random choice of that row hashes the key with a draw counter. The same row therefore gets
the same augmentation in any batch, block, worker or epoch, with no RNG state to carry. Augmentation
index 0 is always the original puzzle.

A task's augmentation is a function `(inputs [B, L], labels [B, L], keys [B] uint64) -> (inputs,
labels)` in `AUGMENTATIONS`, named by the dataset's `metadata.json` ("none" = identity).
"""

import math
from collections.abc import Callable

import numpy as np

from urm_ray.data.tasks.sudoku_solver import BOX_SHAPES
from urm_ray.errors import DataError

AugmentFn = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]

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


def random_bits(keys: np.ndarray, count: int, salt: int) -> np.ndarray:
    """[B, count] uint64 pseudo-random words of each row; `salt` separates independent draws."""
    counters = np.arange(count, dtype=np.uint64) + np.uint64(salt) * np.uint64(1 << 32)  # [count]
    return _splitmix64(keys[:, None] ^ _splitmix64(counters)[None, :])


def random_permutations(keys: np.ndarray, size: int, salt: int) -> np.ndarray:
    """[B, size] int64: a random permutation of range(size) per row."""
    return np.argsort(random_bits(keys, size, salt), axis=1)


def _gather_rows(seq: np.ndarray, src: np.ndarray) -> np.ndarray:
    return np.take_along_axis(seq, src, axis=1)


def _relabel(seq: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """Maps tokens through per-row lookup tables [B, V]; negative (ignored) labels are kept."""
    mapped = np.take_along_axis(lut, np.clip(seq, 0, lut.shape[1] - 1).astype(np.int64), axis=1)
    return np.where(seq >= 0, mapped, seq).astype(seq.dtype)


def _line_order(keys: np.ndarray, n: int, group: int, salt: int) -> np.ndarray:
    """[B, n] source line of each output line: shuffled groups of `group` lines, shuffled within."""
    num_groups = n // group
    group_perm = random_permutations(keys, num_groups, salt)  # [B, G]
    inner = np.argsort(
        random_bits(keys, n, salt + 1).reshape(-1, num_groups, group), axis=2
    )  # [B, G, group]
    return (group_perm[:, :, None] * group + inner).reshape(-1, n)


def sudoku(
    inputs: np.ndarray, labels: np.ndarray, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Digit relabelling, band / stack shuffles, row / column shuffles inside them, and a transpose
    when boxes are square. Tokens: 0 PAD and 1 blank are fixed, digit tokens 2..n+1 are permuted."""
    seq_len = inputs.shape[1]
    n = math.isqrt(seq_len)
    if n * n != seq_len or n not in BOX_SHAPES:
        raise DataError(
            f"sudoku augmentation: seq_len={seq_len} is not a supported board"
            f" (n*n with n in {sorted(BOX_SHAPES)})"
        )
    box_rows, box_cols = BOX_SHAPES[n]
    rows = _line_order(keys, n, box_rows, salt=1)  # [B, n]
    cols = _line_order(keys, n, box_cols, salt=3)  # [B, n]
    src = rows[:, :, None] * n + cols[:, None, :]  # [B, n, n] source cell of each output cell
    if box_rows == box_cols:
        transpose = (random_bits(keys, 1, salt=5)[:, 0] & np.uint64(1)).astype(bool)  # [B]
        src = np.where(transpose[:, None, None], src.transpose(0, 2, 1), src)
    src = src.reshape(-1, seq_len)  # [B, L]
    digit_perm = random_permutations(keys, n, salt=6) + 2  # [B, n] new token of digit tokens 2..n+1
    fixed = np.broadcast_to(np.arange(2), (len(keys), 2))  # PAD and blank map to themselves
    lut = np.concatenate([fixed, digit_perm], axis=1)  # [B, n + 2]
    return _relabel(_gather_rows(inputs, src), lut), _relabel(_gather_rows(labels, src), lut)


def identity(
    inputs: np.ndarray, labels: np.ndarray, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """No augmentation."""
    return inputs, labels


AUGMENTATIONS: dict[str, AugmentFn] = {"none": identity, "sudoku": sudoku}


def get_augmentation(name: str) -> AugmentFn:
    """The registered augmentation `name`; DataError listing the known names otherwise."""
    if name not in AUGMENTATIONS:
        raise DataError(f"unknown augmentation {name!r}; expected one of {sorted(AUGMENTATIONS)}")
    return AUGMENTATIONS[name]


def augment_batch(
    name: str,
    inputs: np.ndarray,
    labels: np.ndarray,
    puzzle_index: np.ndarray,
    aug_index: np.ndarray,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Applies augmentation `name` to rows [B, L]; rows with aug_index 0 are returned unchanged."""
    fn = get_augmentation(name)
    rows = np.flatnonzero(np.asarray(aug_index) != 0)
    if len(rows) == 0:
        return inputs, labels
    keys = row_keys(puzzle_index[rows], aug_index[rows], seed)  # [R]
    new_inputs, new_labels = fn(inputs[rows], labels[rows], keys)
    inputs, labels = inputs.copy(), labels.copy()
    inputs[rows], labels[rows] = new_inputs, new_labels
    return inputs, labels
