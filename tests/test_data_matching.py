"""The nearest-answer searches of the tasks whose valid answers can be listed (N-Queens, whole 4x4
Sudoku boards): each input's draws matched one to one to its valid answers."""

from __future__ import annotations

import numpy as np
import pytest

from urm_ray.data.tasks import nqueens, sudoku
from urm_ray.data.tasks.matching import matched_targets
from urm_ray.errors import ConfigError


def test_matched_targets_take_the_nearest_and_share_a_candidate_only_up_to_its_capacity():
    candidates = np.array([[0, 0, 0], [1, 1, 1]])
    assert matched_targets(np.array([[0, 0, 1], [1, 1, 0]]), candidates).tolist() == [0, 1]
    # four draws all at candidate 0, two candidates: each serves ceil(4 / 2) = 2 of them
    assert sorted(matched_targets(np.zeros((4, 3), dtype=np.int64), candidates).tolist()) == [0, 0, 1, 1]


def _moved_queen(boards: np.ndarray, n: int) -> np.ndarray:
    """Each board with its first row's queen moved one column over (no longer valid)."""
    moved = boards.copy().reshape(len(boards), n, n)
    moved[:, 0] = np.roll(moved[:, 0], 1, axis=1)
    return moved.reshape(len(boards), n * n)


def test_nqueens_draws_one_queen_off_a_solution_are_matched_to_it():
    n = 8
    boards = nqueens.solutions(n).astype(np.int64)[::9]  # 11 distinct solutions
    draws = _moved_queen(boards, n)
    blank = np.full_like(draws, nqueens.EMPTY_TOKEN)
    assert not nqueens.verifier(n * n)(draws, blank, boards).any()
    targets = nqueens.nearest(n * n, nqueens.VOCAB_SIZE)(draws, blank, np.zeros_like(draws))
    np.testing.assert_array_equal(targets, boards)


def test_nqueens_draws_all_alike_are_spread_over_every_solution():
    n = 6
    every = nqueens.solutions(n).astype(np.int64)  # 4 solutions
    draws = np.repeat(every[:1], 8, axis=0)
    blank = np.full_like(draws, nqueens.EMPTY_TOKEN)
    targets = nqueens.nearest(n * n, nqueens.VOCAB_SIZE)(draws, blank, np.zeros_like(draws))
    assert nqueens.verifier(n * n)(targets, blank, targets).all()
    found = [int(np.flatnonzero((every == t).all(1))[0]) for t in targets]
    assert sorted(found) == [0, 0, 1, 1, 2, 2, 3, 3]  # each solution twice: 8 draws over 4


def test_nqueens_targets_keep_the_inputs_queens():
    n = 6
    every = nqueens.solutions(n).astype(np.int64)
    given = np.full((2, n * n), nqueens.EMPTY_TOKEN)
    queen = int(np.flatnonzero(every[2] == nqueens.QUEEN_TOKEN)[0])
    given[:, queen] = nqueens.QUEEN_TOKEN  # a queen only solution 2 of the 4 has
    assert (every[:, queen] == nqueens.QUEEN_TOKEN).sum() == 1
    targets = nqueens.nearest(n * n, nqueens.VOCAB_SIZE)(every[:2], given, np.zeros((2, n * n), dtype=np.int64))
    np.testing.assert_array_equal(targets, every[[2, 2]])


def test_sudoku4_targets_are_valid_boards_keeping_the_givens():
    boards = sudoku.all_grids(4).astype(np.int64) + 1
    inputs = np.where(np.arange(16) % 3 == 0, boards[:6], sudoku.BLANK_TOKEN)  # six puzzles
    inputs = np.concatenate([inputs, np.full((6, 16), sudoku.BLANK_TOKEN)])  # and six blank boards
    draws = np.random.default_rng(0).integers(2, 6, size=(12, 16))
    targets = sudoku.nearest(16, 6)(draws, inputs, np.concatenate([boards[:6], boards[:6]]))
    assert sudoku.verifier(16)(targets, inputs, targets).all()
    distance = lambda t, d: int((t != d).sum())  # noqa: E731
    for target, draw, puzzle in zip(targets[:6], draws[:6], inputs[:6]):  # alone with its input: the nearest
        keeping = boards[((boards == puzzle) | (puzzle == sudoku.BLANK_TOKEN)).all(1)]
        assert distance(target, draw) == min(distance(b, draw) for b in keeping)
    assert len({t.tobytes() for t in targets[6:]}) == 6  # 6 blank-board draws, 288 boards: distinct targets


def test_nearest_searches_refuse_boards_too_large_to_list():
    with pytest.raises(ConfigError, match="nqueens: listing every solution of the 11x11 board"):
        nqueens.nearest(121, nqueens.VOCAB_SIZE)
    with pytest.raises(ConfigError, match="sudoku: a nearest-board search .* 4x4 only \\(got 6x6\\)"):
        sudoku.nearest(36, 8)
