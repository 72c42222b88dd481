"""Sudoku datasets: a seeded generator of unique-solution puzzles, a CSV converter, a verifier.

Grids are digit arrays in row-major order, 0 = blank, sizes n in {4, 6, 9} with boxes 2x2, 2x3
(2 rows x 3 columns) and 3x3. Tokens: PAD 0, blank 1, digit d -> d + 1, so vocab_size = n + 2
and seq_len = n * n. Every cell is supervised: labels are the solution's tokens.

    build_generated("data/sudoku4", size=4, num_train=2000, num_test=200, blanks=9, seed=0)
    build_from_csv("data/sudoku-extreme-1k", "train.csv", "test.csv", subsample=1000, seed=0)
"""

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

from urm_ray.data.progress import Progress, logger
from urm_ray.data.store import DatasetMeta, write_dataset
from urm_ray.errors import ConfigError, DataError

BOX_SHAPES = {4: (2, 2), 6: (2, 3), 9: (3, 3)}
CSV_COLUMNS = ("source", "question", "answer", "rating")
BLANK_TOKEN = 1


@dataclass(frozen=True)
class Geometry:
    """Cell -> row / column / box lookup tables of an n x n board."""

    n: int
    box_rows: int
    box_cols: int
    row_of: tuple[int, ...]
    col_of: tuple[int, ...]
    box_of: tuple[int, ...]


@functools.lru_cache(maxsize=None)
def geometry(n: int) -> Geometry:
    """Lookup tables for size n; ConfigError for unsupported sizes."""
    if n not in BOX_SHAPES:
        raise ConfigError(f"sudoku size={n} is not supported; expected one of {sorted(BOX_SHAPES)}")
    box_rows, box_cols = BOX_SHAPES[n]
    cells = range(n * n)
    return Geometry(
        n=n,
        box_rows=box_rows,
        box_cols=box_cols,
        row_of=tuple(c // n for c in cells),
        col_of=tuple(c % n for c in cells),
        box_of=tuple((c // n) // box_rows * box_rows + (c % n) // box_cols for c in cells),
    )


# ---------------------------------------------------------------------------------------------
# Solver: depth-first search over bitmasks, most-constrained cell first. Bit d marks digit d.


class _Board:
    """A partially filled grid with row / column / box masks of the digits already used."""

    def __init__(self, grid: list[int], geo: Geometry):
        self.geo = geo
        self.grid = list(grid)
        self.full = ((1 << geo.n) - 1) << 1
        self.rows = [0] * geo.n
        self.cols = [0] * geo.n
        self.boxes = [0] * geo.n
        self.empties = [c for c, d in enumerate(self.grid) if d == 0]
        self.consistent = all(self._place_checked(c, d) for c, d in enumerate(self.grid) if d)

    def _place_checked(self, cell: int, digit: int) -> bool:
        bit = 1 << digit
        r, c, b = self.geo.row_of[cell], self.geo.col_of[cell], self.geo.box_of[cell]
        if (self.rows[r] | self.cols[c] | self.boxes[b]) & bit:
            return False
        self.rows[r] |= bit
        self.cols[c] |= bit
        self.boxes[b] |= bit
        return True

    def candidates(self, cell: int) -> int:
        geo = self.geo
        return self.full & ~(self.rows[geo.row_of[cell]] | self.cols[geo.col_of[cell]] | self.boxes[geo.box_of[cell]])

    def set(self, cell: int, digit: int) -> None:
        bit = 1 << digit
        geo = self.geo
        self.grid[cell] = digit
        self.rows[geo.row_of[cell]] |= bit
        self.cols[geo.col_of[cell]] |= bit
        self.boxes[geo.box_of[cell]] |= bit

    def unset(self, cell: int, digit: int) -> None:
        mask = ~(1 << digit)
        geo = self.geo
        self.grid[cell] = 0
        self.rows[geo.row_of[cell]] &= mask
        self.cols[geo.col_of[cell]] &= mask
        self.boxes[geo.box_of[cell]] &= mask

    def most_constrained(self) -> tuple[int, int]:
        """(index into empties, candidate mask) of the empty cell with the fewest candidates."""
        rows, cols, boxes, full = self.rows, self.cols, self.boxes, self.full
        row_of, col_of, box_of = self.geo.row_of, self.geo.col_of, self.geo.box_of
        best_i, best_mask, best_count = -1, 0, 99
        for i, cell in enumerate(self.empties):  # inlined `candidates`: this loop is the hot path
            mask = full & ~(rows[row_of[cell]] | cols[col_of[cell]] | boxes[box_of[cell]])
            count = mask.bit_count()
            if count < best_count:
                best_i, best_mask, best_count = i, mask, count
                if count <= 1:
                    break
        return best_i, best_mask

    def search(self, limit: int, rng: np.random.Generator | None = None, record: list[int] | None = None) -> int:
        """Counts solutions up to `limit` and restores the board. With `rng` digits are tried in random
        order; the last solution found is copied into `record`."""
        if not self.empties:
            if record is not None:
                record[:] = self.grid
            return 1
        i, mask = self.most_constrained()
        if mask == 0:
            return 0
        empties = self.empties
        cell = empties[i]
        empties[i] = empties[-1]
        empties.pop()
        digits = [d for d in range(1, self.geo.n + 1) if mask >> d & 1]
        if rng is not None:
            rng.shuffle(digits)
        found = 0
        for d in digits:
            self.set(cell, d)
            found += self.search(limit - found, rng, record)
            self.unset(cell, d)
            if found >= limit:
                break
        empties.append(cell)
        empties[i], empties[-1] = empties[-1], empties[i]
        return found


def count_solutions(grid: Any, n: int, limit: int = 2) -> int:
    """Number of solutions of a digit grid (0 = blank), counted up to `limit`."""
    board = _Board([int(d) for d in np.asarray(grid).reshape(-1)], geometry(n))
    return board.search(limit) if board.consistent else 0


def random_solution(n: int, rng: np.random.Generator) -> list[int]:
    """A seeded random complete grid (depth-first search with shuffled digit order)."""
    board = _Board([0] * (n * n), geometry(n))
    solution: list[int] = []
    found = board.search(1, rng, solution)
    assert found == 1
    return solution


def _try_blank(board: _Board, cell: int) -> bool:
    """Blanks filled `cell` of a board with a unique solution if the solution stays unique (returns
    True); otherwise leaves the board as it was (returns False)."""
    digit = board.grid[cell]
    board.unset(cell, digit)
    alternatives = board.candidates(cell) & ~(1 << digit)
    for d in range(1, board.geo.n + 1):
        if alternatives >> d & 1:
            board.set(cell, d)
            other = board.search(1) > 0
            board.unset(cell, d)
            if other:
                board.set(cell, digit)
                return False
    board.empties.append(cell)
    return True


def make_puzzle(solution: list[int], n: int, blanks: int, rng: np.random.Generator) -> list[int] | None:
    """Blanks cells of `solution` in random order while the solution stays unique; the puzzle with
    exactly `blanks` blanks, or None when this order gets stuck before reaching it."""
    board = _Board(solution, geometry(n))
    removed = 0
    for cell in rng.permutation(n * n).tolist():
        if removed == blanks:
            break
        removed += _try_blank(board, cell)
    return board.grid if removed == blanks else None


# ---------------------------------------------------------------------------------------------
# Verification and canonical forms (vectorised over rows).


def valid_solutions_mask(grids: np.ndarray, n: int) -> np.ndarray:
    """[B] bool: each row of `grids` [B, n*n] (digits 1..n) is a complete, rule-abiding board."""
    geo = geometry(n)
    grids = np.asarray(grids).reshape(-1, n * n).astype(np.int64)
    in_range = ((grids >= 1) & (grids <= n)).all(axis=1)
    onehot = np.zeros((len(grids), n * n, n + 1), dtype=np.int8)  # [B, L, n+1]
    np.put_along_axis(onehot, np.clip(grids, 0, n)[:, :, None], 1, axis=2)
    ok = in_range
    for unit_of in (geo.row_of, geo.col_of, geo.box_of):
        counts = np.zeros((len(grids), n, n + 1), dtype=np.int32)  # [B, unit, digit]
        np.add.at(counts, (slice(None), np.asarray(unit_of)), onehot)
        ok &= (counts[:, :, 1:] == 1).all(axis=(1, 2))
    return ok


def is_valid_solution(grid: Any, n: int) -> bool:
    """True when `grid` (n*n digits 1..n, flat or n x n) is a complete, valid Sudoku board."""
    arr = np.asarray(grid)
    if arr.size != n * n:
        return False
    return bool(valid_solutions_mask(arr.reshape(1, n * n), n)[0])


def canonical_keys(questions: np.ndarray, n: int) -> np.ndarray:
    """[N] opaque keys equal iff two questions (digits, 0 = blank) differ only by relabelling digits:
    digits are renumbered in order of first appearance."""
    questions = np.asarray(questions).reshape(len(questions), -1)
    length = questions.shape[1]
    keys = []
    for start in range(0, len(questions), 65536):
        chunk = questions[start : start + 65536].astype(np.int64)  # [C, L]
        present = chunk[:, :, None] == np.arange(1, n + 1)  # [C, L, n]
        first = np.where(present.any(axis=1), present.argmax(axis=1), length)  # [C, n]
        rank = np.argsort(np.argsort(first, axis=1, kind="stable"), axis=1) + 1  # [C, n]
        lut = np.concatenate([np.zeros((len(chunk), 1), np.int64), rank], axis=1)  # [C, n+1]
        relabelled = np.take_along_axis(lut, chunk, axis=1).astype(np.uint8)  # [C, L]
        keys.append(relabelled.view(np.dtype((np.void, length))).reshape(-1))
    return np.concatenate(keys) if keys else np.zeros(0, np.dtype((np.void, length)))


def first_occurrence_mask(keys: np.ndarray, exclude: np.ndarray | None = None) -> np.ndarray:
    """[N] bool: True for the first row with each key, and only if the key is not in `exclude`."""
    keep = np.zeros(len(keys), dtype=bool)
    keep[np.unique(keys, return_index=True)[1]] = True
    if exclude is not None and len(exclude):
        keep &= ~np.isin(keys, exclude)
    return keep


# ---------------------------------------------------------------------------------------------
# Generation.


def generate_puzzles(
    n: int, count: int, blanks: int, seed: int, max_failures: int = 1000, progress_every_s: float = 5.0
) -> tuple[np.ndarray, np.ndarray]:
    """`count` unique-solution puzzles with exactly `blanks` blanks, all distinct up to digit relabelling.

    Returns questions and solutions, digit arrays [count, n*n] uint8 (0 = blank)."""
    if not 0 <= blanks < n * n:
        raise ConfigError(f"blanks={blanks} must be in [0, {n * n - 1}] for size {n}")
    rng = np.random.default_rng(seed)
    seen: set[bytes] = set()
    questions, solutions, failures = [], [], 0
    progress = Progress(f"sudoku {n}x{n} generate", count, progress_every_s)
    while len(questions) < count:
        solution = random_solution(n, rng)
        puzzle = make_puzzle(solution, n, blanks, rng)
        key = None if puzzle is None else canonical_keys(np.array([puzzle]), n)[0].tobytes()
        if key is None or key in seen:
            failures += 1
            if failures > max_failures:
                raise DataError(
                    f"sudoku {n}x{n}: gave up after {failures} failed or duplicate draws with {len(questions)}"
                    f"/{count} puzzles; blanks={blanks} may be too many for a unique solution, or there are"
                    " not enough distinct puzzles"
                )
            continue
        seen.add(key)
        questions.append(puzzle)
        solutions.append(solution)
        progress.update(len(questions))
    progress.finish(len(questions))
    shape = (count, n * n)
    return np.array(questions, np.uint8).reshape(shape), np.array(solutions, np.uint8).reshape(shape)


def _split_columns(questions: np.ndarray, solutions: np.ndarray, index: np.ndarray) -> dict[str, np.ndarray]:
    """Stored columns of one split from digit arrays [N, L] and original row ids [N]."""
    return {
        "inputs": questions.astype(np.int16) + 1,  # [N, L]: blank 0 -> token 1, digit d -> d + 1
        "labels": solutions.astype(np.int16) + 1,  # [N, L]
        "puzzle_identifiers": np.zeros(len(questions), np.int32),  # [N]: one shared embedding row
        "puzzle_index": np.asarray(index, np.int64),  # [N]
    }


def _meta(n: int, build: dict[str, Any]) -> DatasetMeta:
    return DatasetMeta(
        task="sudoku",
        vocab_size=n + 2,
        seq_len=n * n,
        num_puzzle_identifiers=1,
        augmentation="sudoku",
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
    overwrite: bool = False,
    progress_every_s: float = 5.0,
) -> DatasetMeta:
    """Generates `num_train + num_test` distinct puzzles and writes splits "train" and "test".

    No question occurs in both splits, even after relabelling digits."""
    geometry(size)
    for name, value in (("num_train", num_train), ("num_test", num_test)):
        if value < 0:
            raise ConfigError(f"{name}={value} must be >= 0")
    questions, solutions = generate_puzzles(size, num_train + num_test, blanks, seed, progress_every_s=progress_every_s)
    splits = {
        "train": _split_columns(questions[:num_train], solutions[:num_train], np.arange(num_train)),
        "test": _split_columns(questions[num_train:], solutions[num_train:], np.arange(num_test)),
    }
    args = {"size": size, "num_train": num_train, "num_test": num_test, "blanks": blanks}
    build = {"builder": "sudoku.build_generated", "arguments": args, "seed": seed, "source": None}
    return write_dataset(out_dir, splits, _meta(size, build), overwrite=overwrite)


# ---------------------------------------------------------------------------------------------
# CSV conversion (Sudoku-Extreme layout: source,question,answer,rating; '.' or '0' = blank).


def _where(path: Path, row: int) -> str:
    """`file: row R (line R+1)` for 1-based data row R (the header is line 1)."""
    return f"{path}: row {row} (line {row + 1})"


def _read_csv_table(path: Path) -> pa.Table:
    """The CSV as string columns; DataError naming the file and row for malformed rows."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    bad_rows: list[Any] = []

    def on_invalid(row: Any) -> str:
        bad_rows.append(row)
        return "error"

    try:
        table = pa_csv.read_csv(
            path,
            read_options=pa_csv.ReadOptions(use_threads=False),
            parse_options=pa_csv.ParseOptions(invalid_row_handler=on_invalid, ignore_empty_lines=False),
            convert_options=pa_csv.ConvertOptions(column_types={c: pa.string() for c in CSV_COLUMNS}),
        )
    except pa.ArrowInvalid as err:
        if bad_rows:
            row = bad_rows[0]
            raise DataError(
                f"{_where(path, row.number - 1)}: malformed row with {row.actual_columns} columns, expected"
                f" {row.expected_columns} ({','.join(CSV_COLUMNS)}): {row.text[:100]!r}"
            ) from err
        raise DataError(f"{path}: cannot parse CSV ({err})") from err
    missing = [c for c in CSV_COLUMNS if c not in table.column_names]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; header is {table.column_names}, expected {list(CSV_COLUMNS)}")
    return table


def _char_matrix(table: pa.Table, column: str, length: int, path: Path) -> np.ndarray:
    """[N, length] uint8 characters of a string column; DataError for the first row of another length."""
    arr = table.column(column).combine_chunks()
    nulls = arr.is_null().to_numpy(zero_copy_only=False)
    lengths = np.where(nulls, -1, pa.compute.binary_length(arr).fill_null(-1).to_numpy(zero_copy_only=False))
    bad = np.flatnonzero(lengths != length)
    if len(bad):
        i = int(bad[0])
        raise DataError(f"{_where(path, i + 1)}: {column} has {max(lengths[i], 0)} characters, expected {length}")
    fixed = arr.cast(pa.binary(length))
    data = np.frombuffer(fixed.buffers()[1], dtype=np.uint8)
    return data[fixed.offset * length : (fixed.offset + len(fixed)) * length].reshape(len(fixed), length)


def _digits(chars: np.ndarray, n: int, column: str, path: Path, allow_blank: bool) -> np.ndarray:
    """Characters -> digits 0..n (0 = blank: '.' or '0', if allowed); DataError for the first bad cell."""
    digits = chars.astype(np.int16) - ord("0")  # [N, L]
    if allow_blank:
        digits[chars == ord(".")] = 0
    ok = (digits >= (0 if allow_blank else 1)) & (digits <= n)
    if not ok.all():
        row, cell = np.argwhere(~ok)[0]
        expected = f"'.', '0' or '1'..'{n}'" if allow_blank else f"'1'..'{n}'"
        raise DataError(
            f"{_where(path, int(row) + 1)}: {column} has {chr(chars[row, cell])!r} at cell {cell}, expected {expected}"
        )
    return digits.astype(np.uint8)


def read_sudoku_csv(path: str | os.PathLike, n: int = 9) -> tuple[np.ndarray, np.ndarray]:
    """Validated (questions, answers) digit arrays [N, n*n] uint8 from a Sudoku-Extreme style CSV."""
    path = Path(path)
    table = _read_csv_table(path)
    questions = _digits(_char_matrix(table, "question", n * n, path), n, "question", path, allow_blank=True)
    answers = _digits(_char_matrix(table, "answer", n * n, path), n, "answer", path, allow_blank=False)
    contradicts = (questions != 0) & (questions != answers)
    if contradicts.any():
        row, cell = np.argwhere(contradicts)[0]
        raise DataError(
            f"{_where(path, int(row) + 1)}: question has {questions[row, cell]} at cell {cell} but the answer has"
            f" {answers[row, cell]}"
        )
    valid = np.concatenate([valid_solutions_mask(answers[s : s + 65536], n) for s in range(0, len(answers), 65536)])
    if len(valid) and not valid.all():
        row = int(np.argmin(valid))
        raise DataError(f"{_where(path, row + 1)}: answer breaks the Sudoku rules (a digit repeats in a row, column or box)")
    return questions, answers


def build_from_csv(
    out_dir: str | os.PathLike,
    train_csv: str | os.PathLike,
    test_csv: str | os.PathLike,
    *,
    size: int = 9,
    subsample: int = 0,
    seed: int = 0,
    overwrite: bool = False,
) -> DatasetMeta:
    """Converts train / test CSVs into a dataset folder with splits "train" and "test".

    Train rows that repeat a test question or an earlier train question (up to relabelling digits)
    are dropped. `subsample=N` keeps a seeded random N of the remaining train puzzles (the papers'
    "1k" setting; 0 keeps all). `puzzle_index` is the 0-based data row in the source CSV."""
    geometry(size)
    test_q, test_a = read_sudoku_csv(test_csv, size)
    train_q, train_a = read_sudoku_csv(train_csv, size)
    keep = first_occurrence_mask(canonical_keys(train_q, size), exclude=canonical_keys(test_q, size))
    train_index = np.flatnonzero(keep)
    if subsample:
        if not 1 <= subsample <= len(train_index):
            raise ConfigError(f"subsample={subsample} must be in [0, {len(train_index)}] (distinct train puzzles)")
        train_index = np.sort(np.random.default_rng(seed).choice(train_index, subsample, replace=False))
    splits = {
        "train": _split_columns(train_q[train_index], train_a[train_index], train_index),
        "test": _split_columns(test_q, test_a, np.arange(len(test_q))),
    }
    args = {"size": size, "subsample": subsample, "train_rows_read": len(train_q), "train_duplicates_dropped": int((~keep).sum())}
    source = {"train_csv": str(Path(train_csv).resolve()), "test_csv": str(Path(test_csv).resolve())}
    build = {"builder": "sudoku.build_from_csv", "arguments": args, "seed": seed, "source": source}
    logger.info("sudoku csv: %d train rows (%d duplicates dropped), %d test rows", len(train_index), (~keep).sum(), len(test_q))
    return write_dataset(out_dir, splits, _meta(size, build), overwrite=overwrite)
