"""ARC augmentation on 30x30 canvases, vectorised over rows, and its inverse for evaluation.

Augmentation index `a` of task `t` (puzzle identifier 1 + t) is one of the 8 dihedral transforms
plus a permutation of colours 1-9 (0 stays), the same for every pair of the task, in any batch,
worker or epoch. As in the official builder, a task's versions are distinct augmented tasks (all
its grids), not just distinct transforms: transforms that differ by one of the task's symmetries
(`arc_tasks.json`'s invariants) give the same grids, so each index names one coset of the
symmetries, in an order keyed by (seed, 1 + t). Index 0 is the original; indices
1..distinct_versions-1 are the other versions, each once; a task with fewer versions than K
(few colours, symmetric grids) repeats them in that order. The augmented pair has its own puzzle
identifier (a repeated version shares its first one)

    1 + t * K + a        K = num_augmentations, table size 1 + T * K

so the puzzle-embedding table is as large as the official one when K = official num_aug + 1.
Training may also translate each pair on the canvas (same shift for input and output, drawn per
(pair, a)); evaluation does not.

    inputs, labels, ids = augment(rows, aug, seed, table, K, True)   # rows: a split's columns
    canonical = invert(predictions, ids, aug, seed, table)      # back to the original task
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

from urm_ray.data.augment import mix, random_bits, row_keys
from urm_ray.data.tasks.arc import (
    COLOUR_OFFSET,
    DIHEDRAL_INVERSE,
    EOS,
    IGNORE_LABEL,
    NUM_COLOURS,
    PAD,
    SEQ_LEN,
    SIDE,
    TaskTable,
)

# d.s of dihedrals d, s: dihedral(dihedral(grid, s), d) == dihedral(grid, DIHEDRAL_PRODUCT[d][s])
DIHEDRAL_PRODUCT = (
    (0, 1, 2, 3, 4, 5, 6, 7), (1, 2, 3, 0, 6, 7, 5, 4), (2, 3, 0, 1, 5, 4, 7, 6),
    (3, 0, 1, 2, 7, 6, 4, 5), (4, 7, 5, 6, 0, 2, 3, 1), (5, 6, 4, 7, 2, 0, 1, 3),
    (6, 4, 7, 5, 1, 3, 0, 2), (7, 5, 6, 4, 3, 1, 2, 0),
)
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


def _coset_representatives(identifiers: np.ndarray, table: TaskTable) -> np.ndarray:
    """[B, 8] bool: dihedral d is the smallest of its left coset d.S, S = the dihedrals under
    which (with some colour permutation) the task is its own image; d = 0 is always one."""
    symmetric = table.possible[identifiers] | (np.arange(8) == 0)  # [B, 8] S (0 also for row 0)
    product = np.asarray(DIHEDRAL_PRODUCT)  # [8, 8] d.s
    outside = product[None] < np.arange(8)[None, :, None]  # [1, 8, 8] d.s sorts before d
    return ~(outside & symmetric[:, None, :]).any(2)


def _used_colours(identifiers: np.ndarray, table: TaskTable) -> np.ndarray:
    """[B, 9] bool: colours 1-9 that appear in the task's grids."""
    return table.fixing[identifiers, 0, 1:] >= 0


def _task_versions(identifiers: np.ndarray, table: TaskTable
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(coset representatives [B, 8], used colours [B, 9], distinct versions [B]) per row."""
    reps = _coset_representatives(identifiers, table)
    used = _used_colours(identifiers, table)
    arrangements = np.ones(len(used), np.int64)  # 9! / (9 - u)!
    for i in range(NUM_COLOURS - 1):
        arrangements *= np.where(i < used.sum(1), NUM_COLOURS - 1 - i, 1)
    return reps, used, reps.sum(1) * arrangements


def distinct_versions(identifiers: np.ndarray, table: TaskTable) -> np.ndarray:
    """[B] int64: how many different augmented tasks (all grids) the transforms give each task.

    Transforms g, h give the same task when h^-1 g is a symmetry of it, so the versions are the
    cosets: (8 / dihedral symmetries) * 9! / (9 - u)! for u used colours among 1-9."""
    return _task_versions(identifiers, table)[2]


def _permute_below(x: np.ndarray, size: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """A keyed bijection of range(size) per row, applied to x [B] < size [B]: a 4-round Feistel
    network on the even number of bits that holds size, cycle-walked back below size (fewer
    than 4 steps on average, as the network's range is under 4 * size)."""
    half = ((np.ceil(np.log2(np.maximum(size, 2))).astype(np.int64) + 1) // 2).astype(np.uint64)
    mask = (np.uint64(1) << half) - np.uint64(1)

    def network(v: np.ndarray, rows: np.ndarray) -> np.ndarray:
        left, right = v >> half[rows], v & mask[rows]
        for r in range(4):
            bits = random_bits(mix(keys[rows], right), 1, salt=3000 + r)[:, 0]
            left, right = right, left ^ (bits & mask[rows])
        return (left << half[rows]) | right

    out = network(x.astype(np.uint64), np.arange(len(x)))
    while (rows := np.flatnonzero(out >= size.astype(np.uint64))).size:
        out[rows] = network(out[rows], rows)
    return out.astype(np.int64)


def _arrangement(index: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Colour permutations [B, 10] (0 fixed) from index [B] < 9! / (9 - u)!: the mixed-radix
    digits of the index pick the image of each used colour in turn, counting from the colour
    itself among the free ones, so index 0 is the identity; unused colours take the free colours
    in order (they change no grid)."""
    n = len(index)
    order = np.argsort(~used, axis=1, kind="stable") + 1  # [B, 9] used colours, then unused
    num_used = used.sum(1)
    perm = np.zeros((n, NUM_COLOURS), np.int64)
    taken = np.zeros((n, NUM_COLOURS - 1), bool)  # [B, 9] colours 1-9 already an image
    targets = np.arange(1, NUM_COLOURS)  # [9]
    rows = np.arange(n)
    for i in range(NUM_COLOURS - 1):
        picking = i < num_used
        start = np.where(picking, order[:, i], 1)[:, None]
        free_first = np.argsort(np.where(taken, 99, (targets - start) % 9), axis=1, kind="stable")
        digit = np.where(picking, index % (NUM_COLOURS - 1 - i), 0)
        index = np.where(picking, index // (NUM_COLOURS - 1 - i), index)
        image = free_first[rows, digit]  # [B] in 0..8 = colour - 1
        perm[rows, order[:, i]] = image + 1
        taken[rows, image] = True
    return perm


def version_index(identifiers: np.ndarray, aug_index: np.ndarray, table: TaskTable) -> np.ndarray:
    """[B] which of its task's distinct versions aug index a is: a mod distinct_versions, so a
    task with fewer versions than K repeats them in order, no more often than it must."""
    return np.asarray(aug_index).astype(np.int64) % distinct_versions(identifiers, table)


def _draw_distinct(identifiers: np.ndarray, aug_index: np.ndarray, seed: int,
                   table: TaskTable) -> tuple[np.ndarray, np.ndarray]:
    """(dihedral [B], colour permutation [B, 10]) of (task identifier, aug index) rows.

    Version v = version_index is coset c of the task's symmetries: c = 0 (the identity) for
    v = 0, else 1 + a keyed bijection of v - 1 over the other cosets, so the first
    distinct_versions indices of a task give different augmented tasks. Coset c is the
    (c // A)-th coset representative dihedral with the (c % A)-th of the A arrangements of the
    used colours."""
    reps, used, versions = _task_versions(identifiers, table)  # [B, 8], [B, 9], [B]
    v = aug_index % versions  # version_index
    keys = row_keys(identifiers, np.zeros_like(v), seed)  # [B] one key per (seed, task)
    coset = np.where(v > 0, 1 + _permute_below(np.maximum(v - 1, 0), np.maximum(versions - 1, 1),
                                               keys), 0)
    arrangements = versions // reps.sum(1)
    d = np.argmax(np.cumsum(reps, axis=1) > (coset // arrangements)[:, None], axis=1)
    return d, _arrangement(coset % arrangements, used)


def draw_transforms(identifiers: np.ndarray, aug_index: np.ndarray, seed: int,
                    table: TaskTable) -> tuple[np.ndarray, np.ndarray]:
    """(dihedral [B], colour permutation [B, 10]) of each (task identifier, aug index) row, drawn
    once per distinct (task, aug index): a block repeats each about pairs-per-task times."""
    pair = np.asarray(identifiers).astype(np.int64) << 32 | np.asarray(aug_index).astype(np.int64)
    unique, inverse = np.unique(pair, return_inverse=True)
    d, perm = _draw_distinct(unique >> 32, unique & 0xFFFFFFFF, seed, table)
    return d[inverse], perm[inverse]


def few_versions(table: TaskTable, num_augmentations: int) -> dict[str, int]:
    """Task name -> distinct versions, for the tasks with fewer than `num_augmentations`."""
    identifiers = np.arange(1, len(table.records) + 1)
    versions = distinct_versions(identifiers, table)
    return {table.name(int(t)): int(n) for t, n in zip(identifiers, versions)
            if n < num_augmentations}


def identifiers_for(identifiers: np.ndarray, aug_index: np.ndarray, num_augmentations: int
                    ) -> np.ndarray:
    """Puzzle identifier of (task identifier 1 + t, aug index a): 1 + t * K + a."""
    return (1 + (identifiers.astype(np.int64) - 1) * num_augmentations + aug_index).astype(np.int32)


def augment(rows: Mapping[str, np.ndarray], aug_index: np.ndarray, seed: int, table: TaskTable,
            num_augmentations: int, translate_grids: bool
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Augmented (inputs [B, 900], labels [B, 900], augmented puzzle identifiers [B]) of stored
    `rows` (a split's columns "inputs", "labels", task identifiers "puzzle_identifiers" and pair
    numbers "puzzle_index", [B] each) in aug indices [B] < num_augmentations."""
    inputs, labels = rows["inputs"], rows["labels"]
    identifiers, pairs = rows["puzzle_identifiers"], rows["puzzle_index"]
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
    versions = version_index(identifiers, aug_index, table)  # a repeated version, its first row
    return inputs, labels, identifiers_for(identifiers, versions, num_augmentations)


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
