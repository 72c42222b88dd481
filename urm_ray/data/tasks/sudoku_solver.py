"""Sudoku solving and puzzle generation in pure Python: a bitmask depth-first search.

Grids are flat lists of digits in row-major order, 0 = blank. Sizes n in {4, 6, 9} have boxes
2x2, 2x3 (2 rows x 3 columns) and 3x3. The search fills the most constrained empty cell first and
keeps one bitmask of used digits per row, column and box (bit d = digit d).
"""

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from urm_ray.errors import ConfigError

BOX_SHAPES = {4: (2, 2), 6: (2, 3), 9: (3, 3)}


@dataclass(frozen=True)
class Geometry:
    """Cell -> row / column / box lookup tables of an n x n board."""

    n: int
    box_rows: int
    box_cols: int
    row_of: tuple[int, ...]
    col_of: tuple[int, ...]
    box_of: tuple[int, ...]
    units: tuple[tuple[int, ...], ...]  # cells of each row, then each column, then each box


@functools.cache
def geometry(n: int) -> Geometry:
    """Lookup tables for size n; ConfigError for unsupported sizes."""
    if n not in BOX_SHAPES:
        raise ConfigError(f"sudoku size={n} is not supported; expected one of {sorted(BOX_SHAPES)}")
    box_rows, box_cols = BOX_SHAPES[n]
    cells = range(n * n)
    row_of = tuple(c // n for c in cells)
    col_of = tuple(c % n for c in cells)
    box_of = tuple(r // box_rows * box_rows + c // box_cols for r, c in zip(row_of, col_of))
    units = tuple(
        tuple(c for c in cells if unit_of[c] == u)
        for unit_of in (row_of, col_of, box_of)
        for u in range(n)
    )
    return Geometry(n, box_rows, box_cols, row_of, col_of, box_of, units)


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
        in_range = all(0 <= d <= geo.n for d in self.grid)
        self.consistent = in_range and all(
            self._place_checked(c, d) for c, d in enumerate(self.grid) if d
        )

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
        return self.full & ~(
            self.rows[geo.row_of[cell]] | self.cols[geo.col_of[cell]] | self.boxes[geo.box_of[cell]]
        )

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

    def search(
        self, limit: int, rng: np.random.Generator | None = None, record: list[int] | None = None
    ) -> int:
        """Counts solutions up to `limit` and restores the board. With `rng`, digits are tried in
        random order; the last solution found is copied into `record`."""
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


def make_puzzle(
    solution: list[int], n: int, blanks: int, rng: np.random.Generator
) -> list[int] | None:
    """Blanks cells of `solution` in random order while the solution stays unique; the puzzle with
    exactly `blanks` blanks, or None when this order gets stuck before reaching it."""
    board = _Board(solution, geometry(n))
    removed = 0
    for cell in rng.permutation(n * n).tolist():
        if removed == blanks:
            break
        removed += _try_blank(board, cell)
    return board.grid if removed == blanks else None
