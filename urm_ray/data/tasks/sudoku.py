"""Sudoku datasets: generated unique-solution puzzles or a converted CSV, plus a verifier.

Boards are n x n with n in {4, 6, 9} (boxes 2x2, 2x3, 3x3), flattened row-major. Digit grids use
0 = blank. Tokens: PAD 0, blank 1, digit d -> d + 1, so vocab_size = n + 2 and seq_len = n * n.
Every cell is supervised: labels are the solution's tokens. Splits "train" and "test" never share
a question, not even with the digits renamed.

    build_generated("data/sudoku4", size=4, num_train=2000, num_test=200, blanks=9, seed=0)
    build_from_csv("data/sudoku-extreme-1k", "train.csv", "test.csv", subsample=1000, seed=0,
                   num_augmentations=1001)

The papers' "1k" setting is `subsample=1000` (a seeded random 1000 of the distinct training
puzzles) streamed with 1000 augmentations each plus the original: `num_augmentations=1001` is
recorded in the metadata (`build.arguments.num_augmentations`) and the training config must ask
for it (`data.num_augmentations: 1001`); the stream warns when they differ.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from urm_ray.data.augment import Transform, random_bits, random_permutations
from urm_ray.data.store import DatasetMeta, check_output_folder, write_dataset, write_dataset_chunks
from urm_ray.data.tasks.puzzle_csv import char_matrix, iter_csv_tables, where
from urm_ray.data.tasks.sudoku_solver import BOX_SHAPES, geometry, make_puzzle, random_solution
from urm_ray.data.tasks.matching import keeping_givens, matched_search
from urm_ray.data.tasks.task import NumpyCheck, NumpySearch, PuzzleTask, board_side
from urm_ray.errors import ConfigError, DataError
from urm_ray.progress import DATA_PROGRESS_EVERY_S, Progress

logger = logging.getLogger("urm_ray.data")

BLANK_TOKEN = 1
_CHUNK = 65536  # rows per vectorised step, to bound temporary memory
CSV_BLOCK_BYTES = 8 * 2**20  # CSV text per streamed block (~50k Sudoku rows)


def valid_solutions_mask(grids: np.ndarray, n: int) -> np.ndarray:
    """[B] bool: each row of `grids` [B, n*n] (digits 1..n) is a complete, rule-abiding board."""
    units = np.asarray(geometry(n).units)  # [3n, n] cells of each row, column and box
    grids = np.asarray(grids).reshape(-1, n * n).astype(np.int64)  # [B, L]
    in_range = ((grids >= 1) & (grids <= n)).all(axis=1)
    bits = np.left_shift(1, np.clip(grids, 0, n))  # [B, L]
    unit_bits = np.bitwise_or.reduce(bits[:, units], axis=2)  # [B, 3n]
    full = (1 << (n + 1)) - 2  # bits 1..n: a unit of n cells holds every digit exactly once
    return in_range & (unit_bits == full).all(axis=1)


def is_valid_solution(grid: Any, n: int) -> bool:
    """True when `grid` (n*n digits 1..n, flat or n x n) is a complete, valid Sudoku board."""
    arr = np.asarray(grid)
    if arr.size != n * n:
        return False
    return bool(valid_solutions_mask(arr.reshape(1, n * n), n)[0])


def canonical_keys(questions: np.ndarray, n: int) -> np.ndarray:
    """[N] keys, equal iff two digit grids differ only by renaming digits (digits are renumbered
    in order of first appearance)."""
    questions = np.asarray(questions).reshape(len(questions), -1)
    length = questions.shape[1]
    keys = [np.zeros(0, np.dtype((np.void, length)))]
    for start in range(0, len(questions), _CHUNK):
        chunk = questions[start : start + _CHUNK].astype(np.int64)  # [C, L]
        present = chunk[:, :, None] == np.arange(1, n + 1)  # [C, L, n]
        first = np.where(present.any(axis=1), present.argmax(axis=1), length)  # [C, n]
        rank = np.argsort(np.argsort(first, axis=1, kind="stable"), axis=1) + 1  # [C, n]
        lut = np.concatenate([np.zeros((len(chunk), 1), np.int64), rank], axis=1)  # [C, n+1]
        relabelled = np.take_along_axis(lut, chunk, axis=1).astype(np.uint8)  # [C, L]
        keys.append(relabelled.view(np.dtype((np.void, length))).reshape(-1))
    return np.concatenate(keys)


def first_occurrence_mask(keys: np.ndarray, exclude: np.ndarray | None = None) -> np.ndarray:
    """[N] bool: True for the first row with each key, and only if the key is not in `exclude`."""
    keep = np.zeros(len(keys), dtype=bool)
    keep[np.unique(keys, return_index=True)[1]] = True
    if exclude is not None and len(exclude):
        keep &= ~np.isin(keys, exclude)
    return keep


def generate_puzzles(
    n: int,
    count: int,
    blanks: int,
    seed: int,
    max_failures: int = 1000,
) -> tuple[np.ndarray, np.ndarray]:
    """`count` unique-solution puzzles with exactly `blanks` blanks, distinct up to renaming digits.

    Returns (questions, solutions), digit arrays [count, n*n] uint8 (0 = blank)."""
    if not 0 <= blanks < n * n:
        raise ConfigError(f"blanks={blanks} must be in [0, {n * n - 1}] for size {n}")
    rng = np.random.default_rng(seed)
    seen: set[bytes] = set()
    questions, solutions, failures = [], [], 0
    progress = Progress(f"sudoku {n}x{n} generate", count, unit="puzzles",
                        every_s=DATA_PROGRESS_EVERY_S)
    while len(questions) < count:
        solution = random_solution(n, rng)
        puzzle = make_puzzle(solution, n, blanks, rng)
        key = None if puzzle is None else canonical_keys(np.array([puzzle]), n)[0].tobytes()
        if key is None or key in seen:
            failures += 1
            if failures > max_failures:
                raise DataError(
                    f"sudoku {n}x{n}: gave up after {failures} failed or repeated draws, with"
                    f" {len(questions)}/{count} puzzles; blanks={blanks} may leave no unique"
                    " solution, or there are too few distinct puzzles"
                )
            continue
        seen.add(key)
        questions.append(puzzle)
        solutions.append(solution)
        progress.update(len(questions))
    progress.finish(len(questions))
    shape = (count, n * n)
    return np.array(questions, np.uint8).reshape(shape), np.array(solutions, np.uint8).reshape(
        shape
    )


def _split_columns(
    questions: np.ndarray, solutions: np.ndarray, index: np.ndarray
) -> dict[str, np.ndarray]:
    """Stored columns of one split from digit arrays [N, L] and source row ids [N]."""
    return {
        "inputs": questions.astype(np.int16) + 1,  # [N, L]: blank 0 -> token 1, digit d -> d + 1
        "labels": solutions.astype(np.int16) + 1,  # [N, L]
        "puzzle_identifiers": np.zeros(len(questions), np.int32),  # [N]: one shared embedding row
        "puzzle_index": np.asarray(index, np.int64),  # [N]
    }


def _check_num_augmentations(num_augmentations: int) -> None:
    if num_augmentations < 0:
        raise ConfigError(
            f"num_augmentations={num_augmentations} must be >= 0 (0 = unset, K >= 1 slots per"
            " puzzle including the original)"
        )


def _meta(n: int, build: dict[str, Any]) -> DatasetMeta:
    return DatasetMeta(
        task=TASK.name,
        vocab_size=n + 2,
        seq_len=n * n,
        num_puzzle_identifiers=1,
        augmentation=TASK.augmentation,
        build=build,
    )


def build_generated(
    out_dir: str | os.PathLike,
    size: int,
    num_train: int,
    num_test: int,
    blanks: int,
    seed: int,
    *,
    num_augmentations: int = 0,
    overwrite: bool = False,
) -> DatasetMeta:
    """Generates `num_train + num_test` distinct puzzles and writes splits "train" and "test".

    `puzzle_index` is the generation order within each split."""
    geometry(size)
    for name, value in (("num_train", num_train), ("num_test", num_test)):
        if value < 0:
            raise ConfigError(f"{name}={value} must be >= 0")
    total = num_train + num_test
    questions, solutions = generate_puzzles(
        size, total, blanks, seed
    )
    splits = {
        "train": _split_columns(questions[:num_train], solutions[:num_train], np.arange(num_train)),
        "test": _split_columns(questions[num_train:], solutions[num_train:], np.arange(num_test)),
    }
    _check_num_augmentations(num_augmentations)
    args = {"size": size, "num_train": num_train, "num_test": num_test, "blanks": blanks,
            "num_augmentations": num_augmentations}
    build = {"builder": "sudoku.build_generated", "arguments": args, "seed": seed, "source": None}
    return write_dataset(out_dir, splits, _meta(size, build), overwrite=overwrite)


def all_grids(size: int) -> np.ndarray:
    """Every valid size x size board [S, size*size] uint8 (digits 1..size), in lexicographic order
    of their rows' permutations; size 4: 288. Only small sizes: rows are enumerated as products."""
    geometry(size)
    if size > 4:
        raise ConfigError(f"size={size}: enumerating every board is only done for size <= 4")
    rows = np.array(list(itertools.permutations(range(1, size + 1))), dtype=np.uint8)  # [P, n]
    picks = np.stack(np.meshgrid(*[np.arange(len(rows))] * size, indexing="ij"), -1).reshape(-1, size)
    grids = rows[picks].reshape(-1, size * size)  # [P^n, n*n]
    return grids[valid_solutions_mask(grids, size)]


def build_blank(out_dir: str | os.PathLike, size: int, repeats: int, *, overwrite: bool = False) -> DatasetMeta:
    """Unconditional boards: every valid board as a label of the blank input, ``repeats`` times in
    split "train" (boards interleaved) and once in split "test". GRAM's generation setting."""
    if repeats < 1:
        raise ConfigError(f"repeats={repeats} must be >= 1")
    grids = all_grids(size)
    index = np.arange(len(grids))
    blank = np.zeros_like(grids)
    train_index = np.tile(index, repeats)
    splits = {"train": _split_columns(blank[train_index], grids[train_index], train_index),
              "test": _split_columns(blank, grids, index)}
    build = {"builder": "sudoku.build_blank", "arguments": {"size": size, "repeats": repeats},
             "seed": None, "source": None}
    return write_dataset(out_dir, splits, _meta(size, build), overwrite=overwrite)


# CSV conversion. Sudoku-Extreme layout (see puzzle_csv): '.' or '0' = blank.


def _digits(
    chars: np.ndarray, n: int, column: str, path: Path, allow_blank: bool, offset: int = 0
) -> np.ndarray:
    """Characters -> digits (0 = blank '.' or '0' if allowed); DataError for the first bad cell."""
    digits = chars.astype(np.int16) - ord("0")  # [N, L]
    if allow_blank:
        digits[chars == ord(".")] = 0
    ok = (digits >= (0 if allow_blank else 1)) & (digits <= n)
    if not ok.all():
        row, cell = np.argwhere(~ok)[0]
        expected = f"'.', '0' or '1'..'{n}'" if allow_blank else f"'1'..'{n}'"
        raise DataError(
            f"{where(path, offset + int(row) + 1)}: {column} has {chr(chars[row, cell])!r} at cell"
            f" {cell}, expected {expected}"
        )
    return digits.astype(np.uint8)


def _check_answers(
    questions: np.ndarray, answers: np.ndarray, n: int, path: Path, offset: int = 0
) -> None:
    """DataError for the first clue that differs from its answer or answer that breaks the rules."""
    contradicts = (questions != 0) & (questions != answers)  # [N, L]
    if contradicts.any():
        row, cell = np.argwhere(contradicts)[0]
        raise DataError(
            f"{where(path, offset + int(row) + 1)}: question has {questions[row, cell]} at cell"
            f" {cell} but the answer has {answers[row, cell]}"
        )
    for start in range(0, len(answers), _CHUNK):
        valid = valid_solutions_mask(answers[start : start + _CHUNK], n)
        if not valid.all():
            row = offset + start + int(np.argmin(valid)) + 1
            raise DataError(
                f"{where(path, row)}: answer breaks the Sudoku rules"
                " (a digit repeats in a row, column or box)"
            )


def iter_sudoku_csv(
    path: str | os.PathLike, n: int = 9, block_bytes: int | None = CSV_BLOCK_BYTES
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Streams validated (rows before the block, questions, answers) digit blocks [B, n*n] uint8
    from a Sudoku-Extreme CSV; memory is bounded by one block of about `block_bytes` of text."""
    path = Path(path)
    for offset, table in iter_csv_tables(path, block_bytes):
        question_chars = char_matrix(table, "question", n * n, path, offset)
        answer_chars = char_matrix(table, "answer", n * n, path, offset)
        questions = _digits(question_chars, n, "question", path, True, offset)
        answers = _digits(answer_chars, n, "answer", path, False, offset)
        _check_answers(questions, answers, n, path, offset)
        yield offset, questions, answers


def read_sudoku_csv(path: str | os.PathLike, n: int = 9) -> tuple[np.ndarray, np.ndarray]:
    """Validated (questions, answers) digit arrays [N, n*n] uint8 from a Sudoku-Extreme CSV."""
    blocks = list(iter_sudoku_csv(path, n, block_bytes=None))
    return blocks[0][1], blocks[0][2]


def _hashed_keys(questions: np.ndarray, n: int) -> np.ndarray:
    """[N] 16-byte keys, equal iff `canonical_keys` are (up to a 2^-64-scale hash collision):
    two independent 64-bit multiply-add hashes of the relabelled grid, so the keys of millions of
    puzzles fit in tens of MB."""
    relabelled = canonical_keys(questions, n).view(np.uint8).reshape(len(questions), -1)
    weights = np.random.default_rng(12345).integers(1, 2**63, size=(relabelled.shape[1], 2),
                                                     dtype=np.uint64) | np.uint64(1)
    hashes = np.zeros((len(questions), 2), np.uint64)
    for cell in range(relabelled.shape[1]):  # wrapping uint64 arithmetic, one column at a time
        hashes = hashes * np.uint64(31) + relabelled[:, cell, None].astype(np.uint64) * weights[cell]
    return np.ascontiguousarray(hashes).view(np.dtype((np.void, 16))).reshape(-1)


def _scan_keys(path: str | os.PathLike, n: int) -> np.ndarray:
    """Pass 1 over a CSV: validates every row and returns the puzzles' hashed keys [N]."""
    start = time.monotonic()
    keys = [np.zeros(0, np.dtype((np.void, 16)))]
    progress = Progress(f"{path} validate", 0, unit="rows", every_s=5.0)
    for offset, questions, _ in iter_sudoku_csv(path, n, CSV_BLOCK_BYTES):
        keys.append(_hashed_keys(questions, n))
        progress.update(offset + len(questions))
    keys = np.concatenate(keys)
    logger.info("%s: %d puzzles checked in %.1f s", path, len(keys), time.monotonic() - start)
    return keys


def _selected_rows(
    path: str | os.PathLike, n: int, index: np.ndarray
) -> Iterator[dict[str, np.ndarray]]:
    """Pass 2: the stored columns of the rows `index` (sorted data-row ids), block by block."""
    for offset, questions, answers in iter_sudoku_csv(path, n, CSV_BLOCK_BYTES):
        lo, hi = np.searchsorted(index, [offset, offset + len(questions)])
        rows = index[lo:hi]
        if len(rows):
            yield _split_columns(questions[rows - offset], answers[rows - offset], rows)


def build_from_csv(
    out_dir: str | os.PathLike,
    train_csv: str | os.PathLike,
    test_csv: str | os.PathLike,
    *,
    size: int = 9,
    subsample: int = 0,
    seed: int = 0,
    num_augmentations: int = 0,
    overwrite: bool = False,
) -> DatasetMeta:
    """Converts train / test CSVs into a dataset folder with splits "train" and "test".

    Train rows repeating a test question or an earlier train question (up to renaming digits) are
    dropped. `subsample=N` keeps a seeded random N of the remaining train puzzles (the papers'
    "1k" setting; 0 keeps all). `puzzle_index` is the 0-based data row in the source CSV.
    Streams: one pass validates every row and keeps a 16-byte key per puzzle, a second pass
    writes the kept rows, so memory is a block of the CSV plus the keys (not the whole file).
    `num_augmentations` (0 = unset) records the K the dataset is meant to be streamed with."""
    geometry(size)
    _check_num_augmentations(num_augmentations)
    test_keys = _scan_keys(test_csv, size)
    train_keys = _scan_keys(train_csv, size)
    keep = first_occurrence_mask(train_keys, test_keys)
    del train_keys
    train_index = np.flatnonzero(keep)
    if subsample:
        if not 1 <= subsample <= len(train_index):
            raise ConfigError(
                f"subsample={subsample} must be in [0, {len(train_index)}] (distinct train puzzles)"
            )
        rng = np.random.default_rng(seed)
        train_index = np.sort(rng.choice(train_index, subsample, replace=False))
    splits = {  # pass 2: only the kept rows are decoded into columns and written
        "train": _selected_rows(train_csv, size, train_index),
        "test": _selected_rows(test_csv, size, np.arange(len(test_keys))),
    }
    dropped = int((~keep).sum())
    logger.info(
        "train: %d rows kept, %d repeats dropped; test: %d", len(train_index), dropped,
        len(test_keys),
    )
    args = {
        "size": size,
        "subsample": subsample,
        "train_rows_read": len(keep),
        "train_repeats_dropped": dropped,
        "num_augmentations": num_augmentations,
    }
    source = {
        "train_csv": str(Path(train_csv).resolve()),
        "test_csv": str(Path(test_csv).resolve()),
    }
    build = {"builder": "sudoku.build_from_csv", "arguments": args, "seed": seed, "source": source}
    return write_dataset_chunks(out_dir, splits, _meta(size, build), overwrite=overwrite)


# --- augmentation, verifier, builder command: the task's registry entry ---------------------------


def _line_order(keys: np.ndarray, n: int, group: int, salt: int) -> np.ndarray:
    """[B, n] source line of each output line: shuffled groups of `group` lines, shuffled within."""
    num_groups = n // group
    group_perm = random_permutations(keys, num_groups, salt)  # [B, G]
    inner = np.argsort(
        random_bits(keys, n, salt + 1).reshape(-1, num_groups, group), axis=2
    )  # [B, G, group]
    return (group_perm[:, :, None] * group + inner).reshape(-1, n)


def augment(inputs: np.ndarray, labels: np.ndarray, keys: np.ndarray) -> Transform:
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
    digit_perm = random_permutations(keys, n, salt=6) + 2  # [B, n] new token of digit tokens 2..n+1
    fixed = np.broadcast_to(np.arange(2), (len(keys), 2))  # PAD and blank map to themselves
    return Transform(src.reshape(-1, seq_len), np.concatenate([fixed, digit_perm], axis=1))


def verifier(seq_len: int) -> NumpyCheck:
    """Answers that keep the input's givens and obey the rules; the label is not needed."""
    n = board_side("sudoku", seq_len)

    def check(answers: np.ndarray, inputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
        # tokens are digit + 1: blank 1 = digit 0, which no valid board contains
        givens = inputs > BLANK_TOKEN
        keeps = np.where(givens, answers == inputs, True).all(axis=1)
        return keeps & valid_solutions_mask(answers.astype(np.int64) - 1, n)

    return check


def nearest(seq_len: int, vocab_size: int) -> NumpySearch:
    """Each input's draws matched one to one to the boards that keep its givens, at the least total
    number of differing cells (``matching.matched_search``): 4x4 boards only (288 in all)."""
    n = board_side("sudoku", seq_len)
    if n > 4:
        raise ConfigError(f"sudoku: a nearest-board search lists every valid board, done for 4x4 only (got {n}x{n})")
    boards = all_grids(n).astype(np.int64) + 1  # digit d -> token d + 1
    return matched_search(lambda input_row: keeping_givens(boards, input_row, input_row > BLANK_TOKEN))


def _build_command(args: argparse.Namespace) -> None:
    check_output_folder(args.out, args.overwrite)  # before reading any input
    if bool(args.train_csv) != bool(args.test_csv):
        raise ConfigError("--train-csv and --test-csv go together")
    if args.train_csv:
        build_from_csv(
            args.out, args.train_csv, args.test_csv, size=args.size, subsample=args.subsample,
            seed=args.seed, num_augmentations=args.num_augmentations, overwrite=args.overwrite,
        )
    else:
        build_generated(
            args.out, size=args.size, num_train=args.num_train, num_test=args.num_test,
            blanks=args.blanks, seed=args.seed, num_augmentations=args.num_augmentations,
            overwrite=args.overwrite,
        )
    print(f"wrote {args.out}")


def add_builder(data: argparse._SubParsersAction) -> None:
    """`urm-ray data sudoku`."""
    s = data.add_parser("sudoku", help="generate n x n Sudoku or convert a Sudoku-Extreme CSV")
    s.add_argument("--out", required=True, help="dataset folder to create")
    s.add_argument("--size", type=int, default=4, choices=[4, 6, 9])
    s.add_argument("--num-train", type=int, default=2000)
    s.add_argument("--num-test", type=int, default=500)
    s.add_argument("--blanks", type=int, default=8, help="blank cells per generated puzzle")
    s.add_argument("--train-csv", help="Sudoku-Extreme style CSV (source,question,answer,rating)")
    s.add_argument("--test-csv", help="held-out CSV (with --train-csv)")
    s.add_argument("--subsample", type=int, default=0, help="keep N training puzzles (1k setting)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--num-augmentations", type=int, default=0,
                   help="K augmentations per puzzle the dataset is meant for (recorded in"
                        " metadata; train with data.num_augmentations=K); 0 = not set")
    s.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --out")
    s.set_defaults(func=_build_command)


TASK = PuzzleTask("sudoku", add_builder=add_builder, augmentation="sudoku", augment=augment,
                  verifier=verifier, nearest=nearest)
