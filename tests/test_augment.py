"""Sudoku augmentation: validity, determinism, identity at index 0, variety."""

import numpy as np
import pytest

from urm_ray.data import augment
from urm_ray.data.tasks import sudoku
from urm_ray.data.tasks.sudoku_solver import count_solutions
from urm_ray.errors import DataError


def _tokens(n: int, count: int, blanks: int) -> tuple[np.ndarray, np.ndarray]:
    questions, solutions = sudoku.generate_puzzles(n, count, blanks, seed=0)
    return questions.astype(np.int8) + 1, solutions.astype(np.int8) + 1  # tokens, as stored


def _augment_all(inputs, labels, num_aug: int, seed: int = 0):
    """Every (puzzle, aug index) pair, puzzle-major."""
    rows = np.repeat(np.arange(len(inputs)), num_aug)
    aug_index = np.tile(np.arange(num_aug), len(inputs))
    out = augment.augment_batch(sudoku.augment, inputs[rows], labels[rows], rows, aug_index, seed)
    return out, rows, aug_index


@pytest.mark.parametrize("n,blanks", [(4, 10), (6, 20), (9, 50)])
def test_augmented_boards_stay_valid_puzzles(n, blanks):
    inputs, labels = _tokens(n, 4, blanks)
    (aug_inputs, aug_labels), _, _ = _augment_all(inputs, labels, 6)
    assert aug_inputs.dtype == inputs.dtype and aug_labels.shape == labels[[0] * 24].shape
    assert sudoku.valid_solutions_mask(aug_labels - 1, n).all()
    clue = aug_inputs != sudoku.BLANK_TOKEN
    assert (aug_inputs[clue] == aug_labels[clue]).all()
    assert ((aug_inputs == sudoku.BLANK_TOKEN).sum(axis=1) == blanks).all()
    if n < 9:
        assert all(count_solutions(q - 1, n) == 1 for q in aug_inputs)


def test_index_zero_is_identity_and_others_vary():
    inputs, labels = _tokens(9, 3, 40)
    (aug_inputs, aug_labels), rows, aug_index = _augment_all(inputs, labels, 16)
    original = aug_index == 0
    assert np.array_equal(aug_inputs[original], inputs) and np.array_equal(
        aug_labels[original], labels
    )
    assert len({row.tobytes() for row in aug_inputs}) == 48


def test_rows_are_deterministic_whatever_the_batch():
    inputs, labels = _tokens(6, 5, 16)
    (a_inputs, a_labels), rows, aug_index = _augment_all(inputs, labels, 4, seed=3)
    order = np.random.default_rng(0).permutation(len(rows))
    b_inputs, b_labels = augment.augment_batch(
        sudoku.augment, inputs[rows[order]], labels[rows[order]], rows[order], aug_index[order], 3
    )
    assert np.array_equal(a_inputs[order], b_inputs) and np.array_equal(a_labels[order], b_labels)
    (c_inputs, _), _, _ = _augment_all(inputs, labels, 4, seed=4)
    assert not np.array_equal(a_inputs, c_inputs)


def test_ignored_labels_and_padding_are_kept():
    inputs, labels = _tokens(4, 2, 6)
    labels = labels.astype(np.int16)
    labels[:, :3] = -100
    inputs[:, 0] = 0
    (aug_inputs, aug_labels), _, _ = _augment_all(inputs, labels, 3)
    assert (aug_labels == -100).sum() == 3 * 3 * 2 and (aug_inputs == 0).sum() == 3 * 2


def test_augmented_rows_invert_to_the_originals():
    inputs, labels = _tokens(6, 4, 16)
    (aug_inputs, aug_labels), rows, aug_index = _augment_all(inputs, labels, 5)
    back = augment.invert_batch(sudoku.augment, aug_labels, inputs[rows], labels[rows], rows,
                                aug_index, 0)
    assert np.array_equal(back, labels[rows]) and not np.array_equal(aug_labels, labels[rows])


def test_bad_board():
    with pytest.raises(DataError, match="seq_len=10"):
        sudoku.augment(np.ones((1, 10), np.int8), np.ones((1, 10), np.int8), np.zeros(1, np.uint64))
