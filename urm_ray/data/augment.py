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


def dihedral_sources(n: int) -> np.ndarray:
    """[8, n*n] int64: for each of the 8 symmetries of the n x n square, the source cell of every
    output cell (row-major). Index 0 is the identity, 1-3 rotate by 90/180/270 degrees, 4 is the
    transpose and 5-7 the transpose followed by those rotations."""
    cells = np.arange(n * n).reshape(n, n)
    views = [np.rot90(cells, k) for k in range(4)]
    views += [np.rot90(cells.T, k) for k in range(4)]
    return np.stack([v.reshape(-1) for v in views])


def dihedral(
    inputs: np.ndarray, labels: np.ndarray, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One of the 7 non-identity symmetries of the square grid per row, the same for input and
    label (mazes: walls, start, goal and path move together; a shortest path stays shortest)."""
    seq_len = inputs.shape[1]
    n = math.isqrt(seq_len)
    if n * n != seq_len:
        raise DataError(f"dihedral augmentation: seq_len={seq_len} is not a square grid")
    transform = 1 + (random_bits(keys, 1, salt=11)[:, 0] % np.uint64(7)).astype(np.int64)  # [B]
    src = dihedral_sources(n)[transform]  # [B, L]
    return _gather_rows(inputs, src), _gather_rows(labels, src)


def coloring(
    inputs: np.ndarray, labels: np.ndarray, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Graph colouring rows (see `tasks.coloring`): the nodes renamed by a random permutation
    (rows and adjacency columns move together) and the colours renamed by a random permutation
    of the colours 0..m, m the largest colour in the row (all k of them in a generated label)."""
    from urm_ray.data.tasks.coloring import COLOR0_TOKEN, num_nodes

    seq_len = inputs.shape[1]
    n = num_nodes(seq_len)
    perm = random_permutations(keys, n, salt=21)  # [B, n] source node of each output node
    columns = np.concatenate([np.zeros((len(keys), 1), np.int64), perm + 1], axis=1)  # [B, n+1]
    src = (perm[:, :, None] * (n + 1) + columns[:, None, :]).reshape(-1, seq_len)  # [B, L]
    inputs, labels = _gather_rows(inputs, src), _gather_rows(labels, src)
    top = np.maximum(inputs.max(axis=1), labels.max(axis=1)).astype(np.int64)  # [B]
    num_colours = np.maximum(top - COLOR0_TOKEN + 1, 0)  # [B] colours 0..m in use
    width = int(num_colours.max(initial=0))
    if width == 0:
        return inputs, labels
    colour = np.arange(width, dtype=np.uint64)
    draws = random_bits(keys, width, salt=23) >> np.uint64(1)  # [B, W] < 2^63
    fixed = np.uint64(1 << 63) + colour  # colours above m sort last, in order: kept
    order = np.argsort(
        np.where(colour[None, :] < num_colours[:, None].astype(np.uint64), draws, fixed), axis=1
    )  # [B, W]: the first m+1 entries permute 0..m
    head = np.broadcast_to(np.arange(COLOR0_TOKEN), (len(keys), COLOR0_TOKEN))
    lut = np.concatenate([head, order + COLOR0_TOKEN], axis=1)  # [B, 4 + W]
    return _relabel(inputs, lut), _relabel(labels, lut)


def identity(
    inputs: np.ndarray, labels: np.ndarray, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """No augmentation."""
    return inputs, labels


AUGMENTATIONS: dict[str, AugmentFn] = {
    "none": identity,
    "sudoku": sudoku,
    "dihedral": dihedral,
    "coloring": coloring,
}


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
