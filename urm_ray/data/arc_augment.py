"""ARC augmentation on 30x30 canvases, vectorised over rows, and its inverse for evaluation.

Augmentation index `a` of task `t` (puzzle identifier 1 + t) is one of the 8 dihedral transforms
plus a permutation of colours 1-9 (0 stays), drawn from the counter-based key of (seed, 1 + t, a):
every pair of the task gets the same transform, in any batch, worker or epoch. Index 0 is the
original; for a > 0, draws that reproduce the original task exactly (per `arc_tasks.json`'s
symmetries) are skipped. The augmented pair has its own puzzle identifier

    1 + t * K + a        K = num_augmentations, table size 1 + T * K

so the puzzle-embedding table is as large as the official one when K = official num_aug + 1.
Training may also translate each pair on the canvas (same shift for input and output, drawn per
(pair, a)); evaluation does not.

    inputs, labels, ids = augment(inputs, labels, ids, pairs, aug, seed, table, K, True)
    canonical = invert(predictions, ids, aug, seed, table)      # back to the original task
"""

from __future__ import annotations

import functools

import numpy as np

from urm_ray.data.augment import random_bits, random_permutations, row_keys
from urm_ray.data.tasks.arc import (
    COLOUR_OFFSET, DIHEDRAL_INVERSE, EOS, IGNORE_LABEL, NUM_COLOURS, PAD, SEQ_LEN, SIDE, TaskTable,
)

MAX_DRAWS = 16  # redraws of a transform that reproduces the original (fully symmetric tasks keep
                # the last draw: every transform of such a task is the original)
_I, _J = np.indices((SIDE, SIDE))  # [30, 30] row and column of each canvas cell
_TRANSPOSING = np.array([False, True, False, True, False, False, True, True])


def shapes(canvases: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(h, w) [B] of grids at the top-left of canvases [B, 900] (stored rows, labels included)."""
    grid = canvases.reshape(-1, SIDE, SIDE) >= COLOUR_OFFSET
    return grid[:, :, 0].sum(1), grid[:, 0, :].sum(1)


def crop_shapes(canvases: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(h, w) [B] of predicted grids as the official evaluator crops them: the largest top-left
    rectangle of colour tokens, scanning rows while the colour run of each row only shrinks."""
    colour = (canvases.reshape(-1, SIDE, SIDE) >= COLOUR_OFFSET) & (
        canvases.reshape(-1, SIDE, SIDE) < COLOUR_OFFSET + NUM_COLOURS)
    run = np.where(colour.all(2), SIDE, np.argmin(colour, axis=2))  # [B, 30] colour prefix per row
    width = np.minimum.accumulate(run, axis=1)  # [B, 30] usable columns with rows 0..r
    area = width * np.arange(1, SIDE + 1)  # [B, 30]
    best = np.argmax(area, axis=1)  # first largest area
    found = area[np.arange(len(area)), best] > 0
    return np.where(found, best + 1, 0), np.where(found, width[np.arange(len(area)), best], 0)


_EOS_CELL, _PAD_CELL = SEQ_LEN, SEQ_LEN + 1  # gather indices of the EOS and PAD values


@functools.cache
def _cell_tables() -> tuple[np.ndarray, np.ndarray]:
    """Gather tables, int16: [8, 31, 31, 900] source cell of each output cell of dihedral d on an
    (h, w) grid (or the EOS / PAD slot), and [31, 31, 900] source cell of a (dr, dc) shift."""
    i, j = _I.reshape(1, 1, -1), _J.reshape(1, 1, -1)  # [1, 1, 900]
    h, w = np.arange(SIDE + 1)[:, None, None], np.arange(SIDE + 1)[None, :, None]  # [31, 1, 1]
    sources = {
        0: (i, j), 1: (j, w - 1 - i), 2: (h - 1 - i, w - 1 - j), 3: (h - 1 - j, i),
        4: (i, w - 1 - j), 5: (h - 1 - i, j), 6: (j, i), 7: (h - 1 - j, w - 1 - i),
    }
    dihedral = np.empty((8, SIDE + 1, SIDE + 1, SEQ_LEN), np.int16)
    for d, (si, sj) in sources.items():
        new_h, new_w = (w, h) if _TRANSPOSING[d] else (h, w)
        inside = (i < new_h) & (j < new_w)
        eos = ((i == new_h) & (j < new_w)) | ((j == new_w) & (i < new_h))
        cell = np.clip(si, 0, SIDE - 1) * SIDE + np.clip(sj, 0, SIDE - 1)
        dihedral[d] = np.where(inside, cell, np.where(eos, _EOS_CELL, _PAD_CELL))
    dr, dc = h, w  # shifts down / right
    si, sj = i - dr, j - dc
    shift = np.where((si >= 0) & (sj >= 0), si * SIDE + sj, _PAD_CELL).astype(np.int16)
    return dihedral, shift


def _gather(canvases: np.ndarray, cells: np.ndarray, pad: int) -> np.ndarray:
    """canvases [B, 900] read at cells [B, 900] (indices, or the EOS / PAD slots)."""
    slots = np.broadcast_to(np.array([EOS, pad], canvases.dtype), (len(canvases), 2))
    return np.take_along_axis(np.concatenate([canvases, slots], 1), cells, axis=1)


def _dihedral_cells(d: np.ndarray, h: np.ndarray, w: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gather cells [B, 900] of dihedral d [B] on grids (h, w) [B], and the new (h, w)."""
    cells = _cell_tables()[0][d, h, w]
    return cells, np.where(_TRANSPOSING[d], w, h), np.where(_TRANSPOSING[d], h, w)


def _shifted(cells: np.ndarray, dr: np.ndarray, dc: np.ndarray) -> np.ndarray:
    """Gather cells [B, 900] followed by a shift of (dr, dc) [B]."""
    shift = _cell_tables()[1][dr, dc]  # [B, 900]: source cell of the shifted canvas
    padded = np.concatenate([cells, np.full((len(cells), 2), _PAD_CELL, cells.dtype)], 1)
    return np.take_along_axis(padded, shift, axis=1)


def dihedral_canvases(canvases: np.ndarray, d: np.ndarray, h: np.ndarray, w: np.ndarray,
                      pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Applies dihedral d [B] to the (h, w) [B] grid of each canvas [B, 900]; re-places the result
    at the top-left with EOS and `pad`. Returns (canvases [B, 900], new h [B], new w [B])."""
    cells, new_h, new_w = _dihedral_cells(d, h, w)
    return _gather(canvases, cells, pad), new_h, new_w


def relabel(canvases: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Colour c -> perm[c] per row (perm [B, 10]); PAD, EOS and ignored labels unchanged."""
    lut = np.concatenate([np.broadcast_to([PAD, EOS], (len(perm), 2)), perm + COLOUR_OFFSET], 1)
    mapped = np.take_along_axis(lut.astype(canvases.dtype), np.maximum(canvases, 0), axis=1)
    return np.where(canvases >= COLOUR_OFFSET, mapped, canvases)


def translate(canvases: np.ndarray, dr: np.ndarray, dc: np.ndarray, pad: int) -> np.ndarray:
    """Shifts each canvas [B, 900] down by dr [B] and right by dc [B] >= 0 rows / columns."""
    assert (np.asarray(dr) >= 0).all() and (np.asarray(dc) >= 0).all(), "shifts must be >= 0"
    return _gather(canvases, _cell_tables()[1][dr, dc], pad)


def draw_transforms(identifiers: np.ndarray, aug_index: np.ndarray, seed: int,
                    table: TaskTable) -> tuple[np.ndarray, np.ndarray]:
    """(dihedral [B], colour permutation [B, 10]) of each (task identifier, aug index) row.

    Index 0 is the identity. Other indices redraw (up to MAX_DRAWS times) while the transform
    reproduces the original task: same dihedral symmetry and same colours on the used colours."""
    n = len(identifiers)
    d = np.zeros(n, np.int64)
    perm = np.tile(np.arange(NUM_COLOURS), (n, 1))
    keys = row_keys(identifiers, aug_index, seed)  # [B]
    todo = np.asarray(aug_index) != 0
    for draw in range(MAX_DRAWS):
        rows = np.flatnonzero(todo)
        if not len(rows):
            break
        k = keys[rows]
        dd = (random_bits(k, 1, salt=2 * draw + 1)[:, 0] % np.uint64(8)).astype(np.int64)
        pp = np.concatenate([np.zeros((len(rows), 1), np.int64),
                             1 + random_permutations(k, NUM_COLOURS - 1, salt=2 * draw + 2)], 1)
        d[rows], perm[rows] = dd, pp
        ids = identifiers[rows]
        fixing = table.fixing[ids, dd]  # [R, 10]
        todo[rows] = table.possible[ids, dd] & ((fixing < 0) | (fixing == pp)).all(1)
    return d, perm


def identifiers_for(identifiers: np.ndarray, aug_index: np.ndarray, num_augmentations: int
                    ) -> np.ndarray:
    """Puzzle identifier of (task identifier 1 + t, aug index a): 1 + t * K + a."""
    return (1 + (identifiers.astype(np.int64) - 1) * num_augmentations + aug_index).astype(np.int32)


def augment(inputs: np.ndarray, labels: np.ndarray, identifiers: np.ndarray, pairs: np.ndarray,
            aug_index: np.ndarray, seed: int, table: TaskTable, num_augmentations: int,
            translate_grids: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Augmented (inputs [B, 900], labels [B, 900], augmented puzzle identifiers [B]) of stored
    rows with task identifiers [B], pair numbers [B] and aug indices [B] < num_augmentations."""
    assert (np.asarray(aug_index) < num_augmentations).all(), "aug index beyond the table"
    d, perm = draw_transforms(identifiers, aug_index, seed, table)
    in_cells, in_h, in_w = _dihedral_cells(d, *shapes(inputs))
    out_cells, out_h, out_w = _dihedral_cells(d, *shapes(labels))
    if translate_grids:
        bits = random_bits(row_keys(pairs, aug_index, seed), 2, salt=1000)  # [B, 2]
        room_r = SIDE - np.maximum(in_h, out_h) + 1  # shifts that keep both grids on the canvas
        room_c = SIDE - np.maximum(in_w, out_w) + 1
        dr = (bits[:, 0] % room_r.astype(np.uint64)).astype(np.int64)
        dc = (bits[:, 1] % room_c.astype(np.uint64)).astype(np.int64)
        in_cells, out_cells = _shifted(in_cells, dr, dc), _shifted(out_cells, dr, dc)
    inputs = relabel(_gather(inputs, in_cells, PAD), perm)
    labels = relabel(_gather(labels, out_cells, IGNORE_LABEL), perm)
    return inputs, labels, identifiers_for(identifiers, aug_index, num_augmentations)


def invert(predictions: np.ndarray, identifiers: np.ndarray, aug_index: np.ndarray, seed: int,
           table: TaskTable) -> np.ndarray:
    """Canonical canvases [B, 900] int8 (grid top-left, EOS, PAD 0) of predictions [B, 900] made on
    augmented rows, mapped back to the original task: crop, inverse dihedral, inverse colours.
    An empty crop gives an all-PAD canvas, which matches no answer."""
    d, perm = draw_transforms(identifiers, aug_index, seed, table)
    canvases = np.asarray(predictions).astype(np.int8)
    h, w = crop_shapes(canvases)
    inverse_d = np.asarray(DIHEDRAL_INVERSE)[d]
    out, _, _ = dihedral_canvases(canvases, inverse_d, h, w, pad=PAD)
    return relabel(out, np.argsort(perm, axis=1))


def crop_canonical(predictions: np.ndarray) -> np.ndarray:
    """Canonical canvases [B, 900] of predictions [B, 900] as they stand (no augmentation)."""
    canvases = np.asarray(predictions).astype(np.int8)
    d = np.zeros(len(canvases), np.int64)
    out, _, _ = dihedral_canvases(canvases, d, *crop_shapes(canvases), pad=PAD)
    return out


def canonical(labels: np.ndarray) -> np.ndarray:
    """Stored label canvases [B, 900] in the canonical form `invert` returns (ignore -> PAD)."""
    return np.where(labels == IGNORE_LABEL, PAD, labels).astype(np.int8)
