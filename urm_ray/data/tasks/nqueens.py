"""N-Queens: every solution of the n x n board, a verifier, and an unconditional dataset.

Boards are flattened row-major, seq_len = n * n. Tokens: PAD 0, empty 1, queen 2 (vocab_size 3).
A board is valid when it holds exactly one queen per row and per column and at most one per
diagonal. The dataset is unconditional (GRAM's generation setting): every input is the empty
board and the label is one of the solutions, so one input has several correct answers and only a
verifier, not the label, can judge a prediction.

    solutions(6)                                  # [4, 36] tokens
    build_unconditional("data/nqueens6", n=6, repeats=256)
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

from urm_ray.data.store import DatasetMeta, check_output_folder, write_dataset
from urm_ray.data.tasks.matching import keeping_givens, matched_search
from urm_ray.data.tasks.task import NumpyCheck, NumpySearch, PuzzleTask, board_side
from urm_ray.errors import ConfigError

PAD_TOKEN, EMPTY_TOKEN, QUEEN_TOKEN = 0, 1, 2
VOCAB_SIZE = 3


def _check_n(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"n={n!r} must be an int >= 1")


def queen_columns(n: int) -> list[tuple[int, ...]]:
    """All solutions as the queen's column in each row, in lexicographic order (backtracking)."""
    _check_n(n)
    found: list[tuple[int, ...]] = []

    def place(cols: tuple[int, ...], used: int, diag: int, anti: int) -> None:
        row = len(cols)
        if row == n:
            found.append(cols)
            return
        for col in range(n):
            d, a = 1 << (row + col), 1 << (row - col + n - 1)
            if not (used >> col & 1 or diag & d or anti & a):
                place(cols + (col,), used | 1 << col, diag | d, anti | a)

    place((), 0, 0, 0)
    return found


def solutions(n: int) -> np.ndarray:
    """All solutions as token boards [S, n*n] uint8 (empty 1, queen 2); n=4: 2, n=6: 4, n=8: 92."""
    cols = np.array(queen_columns(n), dtype=np.int64).reshape(-1, n)  # [S, n]
    boards = np.full((len(cols), n, n), EMPTY_TOKEN, dtype=np.uint8)
    rows = np.arange(n)
    for index, placement in enumerate(cols):
        boards[index, rows, placement] = QUEEN_TOKEN
    return boards.reshape(len(cols), n * n)


def valid_queens_mask(boards: Any, n: int) -> np.ndarray:
    """[B] bool: each row of ``boards`` [B, n*n] (tokens) is a complete, non-attacking placement."""
    boards = np.asarray(boards).reshape(-1, n * n)
    queens = (boards == QUEEN_TOKEN).reshape(-1, n, n).astype(np.int64)  # [B, n, n]
    only_cells = ((boards == QUEEN_TOKEN) | (boards == EMPTY_TOKEN)).all(axis=1)
    rows, cols = np.indices((n, n))
    diagonals = np.eye(2 * n - 1, dtype=np.int64)[(rows + cols).ravel()]  # [n*n, 2n-1] one-hot
    antidiagonals = np.eye(2 * n - 1, dtype=np.int64)[(rows - cols + n - 1).ravel()]
    flat = queens.reshape(-1, n * n)
    return (
        only_cells
        & (queens.sum(axis=2) == 1).all(axis=1)  # one per row
        & (queens.sum(axis=1) == 1).all(axis=1)  # one per column
        & ((flat @ diagonals) <= 1).all(axis=1)
        & ((flat @ antidiagonals) <= 1).all(axis=1)
    )


def is_valid_queens(board: Any, n: int) -> bool:
    """True when ``board`` (n*n tokens, flat or n x n) is a valid n-queens solution."""
    arr = np.asarray(board)
    if arr.size != n * n:
        return False
    return bool(valid_queens_mask(arr.reshape(1, n * n), n)[0])


def _split(boards: np.ndarray, index: np.ndarray) -> dict[str, np.ndarray]:
    """Columns of one split: empty-board inputs, solution labels [N, L], solution ids [N]."""
    return {
        "inputs": np.full(boards.shape, EMPTY_TOKEN, dtype=np.int16),  # [N, L]: all blank
        "labels": boards.astype(np.int16),  # [N, L]
        "puzzle_identifiers": np.zeros(len(boards), np.int32),  # one shared embedding row
        "puzzle_index": index.astype(np.int64),  # which solution the row holds
    }


def build_unconditional(
    out_dir: str | os.PathLike, n: int, repeats: int, *, overwrite: bool = False
) -> DatasetMeta:
    """Writes split "train" (every solution ``repeats`` times, solutions interleaved) and split
    "test" (every solution once). Deterministic: there is nothing to draw."""
    if repeats < 1:
        raise ConfigError(f"repeats={repeats} must be >= 1")
    boards = solutions(n)
    if not len(boards):
        raise ConfigError(f"n={n}: the board has no solution")
    index = np.arange(len(boards))
    train_index = np.tile(index, repeats)  # [S * repeats]
    splits = {"train": _split(boards[train_index], train_index), "test": _split(boards, index)}
    build = {"builder": "nqueens.build_unconditional", "arguments": {"n": n, "repeats": repeats},
             "seed": None, "source": None}
    meta = DatasetMeta(task=TASK.name, vocab_size=VOCAB_SIZE, seq_len=n * n,
                       num_puzzle_identifiers=1, augmentation=TASK.augmentation, build=build)
    return write_dataset(out_dir, splits, meta, overwrite=overwrite)


# --- verifier, builder command: the task's registry entry ------------------------------------------


def verifier(seq_len: int) -> NumpyCheck:
    """Non-attacking placements that keep the input's queens (an empty input gives none)."""
    n = board_side("nqueens", seq_len)

    def check(answers: np.ndarray, inputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
        givens = inputs == QUEEN_TOKEN
        keeps = np.where(givens, answers == QUEEN_TOKEN, True).all(axis=1)
        return keeps & valid_queens_mask(answers, n)

    return check


MAX_NEAREST_N = 10  # 724 solutions: the largest board whose solutions `nearest` lists


def nearest(seq_len: int, vocab_size: int) -> NumpySearch:
    """Each input's draws matched one to one to its solutions (those keeping its queens) at the
    least total number of differing cells (``matching.matched_search``); boards up to 10 x 10."""
    n = board_side("nqueens", seq_len)
    if n > MAX_NEAREST_N:
        raise ConfigError(f"nqueens: listing every solution of the {n}x{n} board for a nearest-solution search is"
                          f" only done up to {MAX_NEAREST_N}x{MAX_NEAREST_N}")
    boards = solutions(n).astype(np.int64)
    return matched_search(lambda input_row: keeping_givens(boards, input_row, input_row == QUEEN_TOKEN))


def _build_command(args: argparse.Namespace) -> None:
    check_output_folder(args.out, args.overwrite)  # before any work
    build_unconditional(args.out, n=args.size, repeats=args.repeats, overwrite=args.overwrite)
    print(f"wrote {args.out}")


def add_builder(data: argparse._SubParsersAction) -> None:
    """`urm-ray data nqueens`."""
    q = data.add_parser("nqueens", help="every n-queens solution as labels of the empty board")
    q.add_argument("--out", required=True, help="dataset folder to create")
    q.add_argument("--size", type=int, default=8, help="board side n")
    q.add_argument("--repeats", type=int, default=64, help="copies of each solution in train")
    q.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --out")
    q.set_defaults(func=_build_command)


# every solution of the empty board is already a label: no augmentation
TASK = PuzzleTask("nqueens", add_builder=add_builder, verifier=verifier, nearest=nearest)
