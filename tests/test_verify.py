"""Task verifiers: each accepts valid answers (any of several) and rejects near misses."""

import numpy as np
import pytest
import torch

from urm_ray.data.tasks import coloring, maze, nqueens, sudoku
from urm_ray.data.tasks.sudoku_solver import random_solution
from urm_ray.data.tasks.verify import verifier_for
from urm_ray.errors import ConfigError


def _run(task: str, answers, inputs, labels=None) -> list[bool]:
    answers = torch.as_tensor(np.asarray(answers)).long()
    inputs = torch.as_tensor(np.asarray(inputs)).long().expand_as(answers)
    labels = answers if labels is None else torch.as_tensor(np.asarray(labels)).long()
    ok = verifier_for(task, answers.shape[1])(answers, inputs, labels)
    assert ok.dtype == torch.bool and ok.shape == (answers.shape[0],)
    return ok.tolist()


# --- Sudoku -----------------------------------------------------------------------------------


def test_sudoku_rules_and_givens():
    rng = np.random.default_rng(0)
    solution = np.asarray(random_solution(9, rng)).reshape(81)  # digits 1..9
    puzzle = np.where(rng.random(81) < 0.5, 0, solution)
    inputs = puzzle + 1  # tokens: blank 1, digit d -> d + 1
    relabelled = np.roll(np.arange(1, 10), 1)[solution - 1]  # valid board, other digits
    swapped = solution.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # two cells of a row exchanged: columns break
    blank_left = np.where(np.arange(81) == int(np.flatnonzero(puzzle == 0)[0]), 0, solution)
    answers = np.stack([solution, relabelled, swapped, blank_left]) + 1
    assert _run("sudoku", answers, inputs) == [True, False, False, False]
    # without givens (unconditional generation) any valid board passes
    assert _run("sudoku", answers, np.ones(81)) == [True, True, False, False]


# --- N-Queens ---------------------------------------------------------------------------------


def test_nqueens_any_solution_and_givens():
    boards = nqueens.solutions(6)  # 4 solutions
    empty = np.full(36, nqueens.EMPTY_TOKEN)
    attacked = boards[0].reshape(6, 6).copy()
    row = int(np.argmax(attacked[0] == nqueens.QUEEN_TOKEN))
    attacked[0, row] = nqueens.EMPTY_TOKEN
    attacked[0, (row + 1) % 6] = nqueens.QUEEN_TOKEN  # one queen moved one step sideways
    missing = boards[0].copy()
    missing[np.argmax(missing == nqueens.QUEEN_TOKEN)] = nqueens.EMPTY_TOKEN
    answers = np.stack([*boards, attacked.reshape(36), missing])
    assert _run("nqueens", answers, empty) == [True] * 4 + [False, False]
    # one given queen, where solution 1 has a queen and solution 0 has none
    cell = int(np.flatnonzero((boards[1] == nqueens.QUEEN_TOKEN) & (boards[0] != nqueens.QUEEN_TOKEN))[0])
    given = empty.copy()
    given[cell] = nqueens.QUEEN_TOKEN
    expected = [bool(b[cell] == nqueens.QUEEN_TOKEN) for b in boards]
    assert expected[:2] == [False, True] and _run("nqueens", boards, given) == expected


# --- graph colouring --------------------------------------------------------------------------


def _triangle_plus_leaf():
    """Nodes 0-1-2 a triangle, node 3 joined to 0: proper 3-colourings exist, 2 is too few."""
    adjacency = np.zeros((1, 4, 4), bool)
    for a, b in ((0, 1), (1, 2), (0, 2), (0, 3)):
        adjacency[0, a, b] = adjacency[0, b, a] = True
    return adjacency


def test_coloring_proper_colourings_and_near_misses():
    adjacency = _triangle_plus_leaf()
    inputs, _ = coloring.encode(adjacency, np.zeros((1, 4), np.int64))
    colourings = [[0, 1, 2, 1], [2, 0, 1, 0], [0, 1, 2, 2],  # valid (leaf may reuse 1 or 2)
                  [0, 1, 2, 0],  # near miss: leaf takes its neighbour 0's colour
                  [0, 1, 1, 2]]  # near miss: two triangle nodes share a colour
    answers = np.concatenate([coloring.encode(adjacency, np.array([c]))[1] for c in colourings])
    answers = np.where(answers < 0, coloring.NO_EDGE_TOKEN, answers)  # adjacency cells ignored
    assert _run("coloring", answers, inputs) == [True, True, True, False, False]
    uncoloured = answers[:1].copy()
    uncoloured[0, 3 * 5] = coloring.BLANK_TOKEN  # node 3's slot left blank
    assert _run("coloring", uncoloured, inputs) == [False]
    given = inputs.copy()
    given[0, 0] = coloring.COLOR0_TOKEN + 2  # node 0 must be colour 2
    assert _run("coloring", answers[:3], given) == [False, True, False]


# --- maze -------------------------------------------------------------------------------------

OPEN_3X4 = """
S...
....
...G
"""


def _grid(text: str) -> np.ndarray:
    chars = {"#": maze.WALL_TOKEN, ".": maze.OPEN_TOKEN, "S": maze.START_TOKEN,
             "G": maze.GOAL_TOKEN, "o": maze.PATH_TOKEN}
    rows = [line for line in text.strip().splitlines()]
    side = max(len(rows), len(rows[0]))
    grid = np.full((side, side), maze.WALL_TOKEN)
    for r, line in enumerate(rows):
        grid[r, : len(line)] = [chars[c] for c in line]
    return grid.reshape(-1)


def test_maze_accepts_every_shortest_path_and_rejects_near_misses():
    inputs = _grid(OPEN_3X4)  # 4x4 with a wall row at the bottom; shortest path: 5 moves
    answers = [
        _grid("Sooo\n...o\n...G"),  # along the top then down
        _grid("S...\no...\noooG"),  # down then along the bottom
        _grid("So..\n.oo.\n..oG"),  # a staircase, also 5 moves
        _grid("Sooo\n...o\n..oG"),  # an extra path cell beside the route: not a simple path
        _grid("Soo.\n...o\n..oG"),  # near miss: right count, but a diagonal gap
        _grid("Sooo\n.ooo\n...G"),  # a detour: 6 path cells
        _grid("S...\n....\n...G"),  # no path marked
    ]
    answers = np.stack(answers)
    expected = [True, True, True, False, False, False, False]
    label = np.tile(answers[0], (len(answers), 1))  # the verifier reads the shortest length here
    assert _run("maze", answers, inputs, label) == expected
    # with the shortest length found by BFS instead, and with an unmarked (ignored) label
    assert maze.valid_paths_mask(answers, np.tile(inputs, (len(answers), 1)), 4).tolist() == expected
    assert _run("maze", answers, inputs, np.full_like(answers, -100)) == expected


def test_maze_answer_must_keep_walls_start_and_goal():
    inputs = _grid("S#.\n.#.\n..G")
    good = _grid("S#.\no#.\nooG")
    through_wall = _grid("So.\n.oo\n..G")  # crosses a wall cell
    moved_goal = _grid("S#.\no#.\noGo")  # the goal token written elsewhere
    answers = np.stack([good, through_wall, moved_goal])
    assert _run("maze", answers, inputs, np.tile(good, (3, 1))) == [True, False, False]


def test_maze_without_route_needs_an_empty_answer():
    inputs = _grid("S#.\n##.\n..G")
    answers = np.stack([inputs, _grid("S#o\n##.\n..G")])
    assert _run("maze", answers, inputs, np.tile(inputs, (2, 1))) == [True, False]
    no_goal = _grid("S..\n...\n...")
    assert _run("maze", no_goal[None], no_goal, no_goal[None]) == [False]


def test_generated_maze_labels_pass_and_shifted_paths_fail():
    inputs, labels = next(maze.generate_mazes(11, 4, maze.Filter(min_path=20), seed=4))
    assert _run("maze", labels, inputs, labels) == [True] * len(labels)
    broken, moved = labels.copy(), labels.copy()
    for row, other in zip(broken, moved):
        cells = np.flatnonzero(row == maze.PATH_TOKEN)
        row[cells[0]] = maze.OPEN_TOKEN  # drop one path cell: the route breaks
        other[cells[0]] = maze.OPEN_TOKEN  # and mark a stray open cell instead: count is right
        other[np.flatnonzero(other == maze.OPEN_TOKEN)[-1]] = maze.PATH_TOKEN
    assert _run("maze", broken, inputs, labels) == [False] * len(labels)
    assert _run("maze", moved, inputs, labels) == [False] * len(labels)


# --- registry ---------------------------------------------------------------------------------


def test_registry_errors_and_device():
    with pytest.raises(ConfigError, match="unknown task 'arc2'"):
        verifier_for("arc2", 900)
    with pytest.raises(ConfigError, match="seq_len=35 is not a square"):
        verifier_for("maze", 35)
    with pytest.raises(ConfigError, match="seq_len=35 is not n"):
        verifier_for("coloring", 35)
    boards = torch.from_numpy(nqueens.solutions(4)).long()
    ok = verifier_for("nqueens", 16)(boards, torch.ones_like(boards), boards)
    assert ok.device == boards.device and ok.tolist() == [True, True]
    assert sudoku.BLANK_TOKEN == 1  # the Sudoku verifier's reading of givens relies on it
