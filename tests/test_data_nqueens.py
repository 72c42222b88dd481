"""N-Queens: solution enumeration, the verifier, and the unconditional dataset."""

import numpy as np
import pytest

from urm_ray.data.store import read_metadata, read_split
from urm_ray.data.tasks.nqueens import (
    EMPTY_TOKEN,
    QUEEN_TOKEN,
    build_unconditional,
    is_valid_queens,
    queen_columns,
    solutions,
    valid_queens_mask,
)
from urm_ray.errors import ConfigError


@pytest.mark.parametrize(("n", "count"), [(1, 1), (2, 0), (3, 0), (4, 2), (5, 10), (6, 4), (8, 92)])
def test_enumerates_every_solution(n, count):
    boards = solutions(n)
    assert boards.shape == (count, n * n)
    assert len({b.tobytes() for b in boards}) == count
    assert valid_queens_mask(boards, n).all() if count else True
    assert set(np.unique(boards)) <= {EMPTY_TOKEN, QUEEN_TOKEN}


def test_six_queens_solutions_are_the_known_ones():
    assert queen_columns(6) == [(1, 3, 5, 0, 2, 4), (2, 5, 1, 4, 0, 3), (3, 0, 4, 1, 5, 2), (4, 2, 0, 5, 3, 1)]


def _board(cols, n):
    board = np.full((n, n), EMPTY_TOKEN)
    for row, col in enumerate(cols):
        if col is not None:
            board[row, col] = QUEEN_TOKEN
    return board


@pytest.mark.parametrize(
    ("cols", "why"),
    [
        ((0, 1, 2, 3, 4, 5), "diagonal"),
        ((1, 3, 5, 0, 2, 2), "shared column"),
        ((1, 3, 5, 0, 2, None), "missing queen"),
        ((4, 2, 0, 5, 1, 3), "anti-diagonal"),
    ],
)
def test_verifier_rejects_attacks_and_gaps(cols, why):
    assert not is_valid_queens(_board(cols, 6), 6), why


def test_verifier_accepts_solutions_and_checks_tokens():
    good = _board((1, 3, 5, 0, 2, 4), 6)
    assert is_valid_queens(good, 6) and is_valid_queens(good.ravel(), 6)
    two_in_row = good.copy()
    two_in_row[0, 0] = QUEEN_TOKEN
    assert not is_valid_queens(two_in_row, 6)
    padded = good.copy()
    padded[5, 5] = 0  # PAD where an empty cell belongs
    assert not is_valid_queens(padded, 6)
    assert not is_valid_queens(good.ravel()[:-1], 6)  # wrong size
    mask = valid_queens_mask(np.stack([good.ravel(), two_in_row.ravel()]), 6)
    assert mask.tolist() == [True, False]


def test_unconditional_dataset(tmp_path):
    meta = build_unconditional(tmp_path / "nq6", n=6, repeats=3)
    assert (meta.task, meta.vocab_size, meta.seq_len, meta.num_puzzle_identifiers, meta.augmentation) == (
        "nqueens", 3, 36, 1, "none")
    assert read_metadata(tmp_path / "nq6").splits["train"].num_rows == 12
    train, test = read_split(tmp_path / "nq6", "train"), read_split(tmp_path / "nq6", "test")
    assert (train["inputs"] == EMPTY_TOKEN).all() and (test["inputs"] == EMPTY_TOKEN).all()
    assert valid_queens_mask(train["labels"], 6).all()
    assert np.bincount(train["puzzle_index"]).tolist() == [3, 3, 3, 3]
    np.testing.assert_array_equal(solutions(6)[train["puzzle_index"]], train["labels"])  # index = solution id
    np.testing.assert_array_equal(test["labels"], solutions(6))
    with pytest.raises(ConfigError, match="repeats=0"):
        build_unconditional(tmp_path / "bad", n=6, repeats=0)
    with pytest.raises(ConfigError, match="n=3: the board has no solution"):
        build_unconditional(tmp_path / "bad", n=3, repeats=1)


def test_verifier_registry_works_on_token_tensors():
    import torch

    from urm_ray.data.tasks.sudoku_solver import random_solution
    from urm_ray.data.tasks.verify import verifier_for

    boards = torch.from_numpy(solutions(6)).long()
    broken = boards.clone()
    broken[:, 0] = QUEEN_TOKEN if broken[0, 0] != QUEEN_TOKEN else EMPTY_TOKEN
    accepts = verifier_for("nqueens", seq_len=36)
    answers = torch.cat([boards, broken[:1]])
    empty = torch.full_like(answers, EMPTY_TOKEN)
    assert accepts(answers, empty, answers).tolist() == [True] * 4 + [False]
    grid = torch.as_tensor(np.asarray(random_solution(4, np.random.default_rng(0))).reshape(1, 16) + 1)
    swapped = grid[:, [1, 0, *range(2, 16)]]  # two cells of the first row swapped: columns break
    both = torch.cat([grid, swapped])
    blank = torch.ones_like(both)
    assert verifier_for("sudoku", 16)(both, blank, both).tolist() == [True, False]
    with pytest.raises(ConfigError, match="unknown task 'arc2'"):
        verifier_for("arc2", 36)
    with pytest.raises(ConfigError, match="seq_len=35 is not a square"):
        verifier_for("nqueens", 35)


def test_cli_builds_every_solution(tmp_path, capsys):
    from urm_ray.cli import main
    from urm_ray.data import store

    assert main(["data", "nqueens", "--out", str(tmp_path / "q"), "--size", "6",
                 "--repeats", "3"]) == 0
    test = store.read_split(tmp_path / "q", "test")
    assert len(test["labels"]) == 4 and valid_queens_mask(test["labels"], 6).all()
    assert store.read_metadata(tmp_path / "q").splits["train"].num_rows == 12
    assert main(["data", "nqueens", "--out", str(tmp_path / "bad"), "--size", "3"]) == 2
    assert "n=3: the board has no solution" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
