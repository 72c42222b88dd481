"""Mazes: generated n x n grids whose label is a shortest path from start to goal, plus a verifier.

Cells are tokenised as in the official HRM maze data (charset "# SGo", PAD 0): wall 1, open 2,
start 3, goal 4, path 5 (vocab_size 6), flattened row-major, seq_len = n * n. The input is the
maze; the label is the same grid with the cells strictly between start and goal on one shortest
path marked as path. Moves go between 4-neighbours; the path length is the number of moves, so a
path of length d marks d - 1 cells.

Generation: a random depth-first-search maze (corridors one cell wide, rooms on even coordinates)
with each remaining wall between two rooms knocked down with probability `loop_prob`, so there are
several routes and the shortest must be found; start and goal are two random rooms; BFS solves
it. A maze is kept when the shortest path has at least `min_path` moves (the hardness filter; the
papers' Maze-Hard is 30x30 with paths over 110) and, with `unique_path`, no other path is as
short (so the label is the one correct answer). For even n the last row and column are wall.
Mazes are distinct up to the 8 symmetries of the square across both splits, so the dihedral
augmentation cannot turn a training maze into a test maze. Rooms and knocked-down walls, rather
than random walls as in Searchformer: random-wall mazes keep their shortest paths too short to meet
the papers' hardness (docs/experiments/data-choices.md).

    build_generated("data/maze30", n=30, num_train=1000, num_test=1000, keep=Filter(min_path=110))
    build_from_csv("data/maze-hard", "train.csv", "test.csv")     # the official CSVs
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from urm_ray.data.augment import dihedral
from urm_ray.data.store import (
    DatasetMeta,
    check_output_folder,
    split_chunk_stream,
    write_dataset,
    write_dataset_chunks,
)
from urm_ray.data.tasks.puzzle_csv import char_matrix, read_csv_table, where
from urm_ray.data.tasks.task import NumpyCheck, PuzzleTask, board_side
from urm_ray.errors import ConfigError, DataError
from urm_ray.progress import DATA_PROGRESS_EVERY_S, Progress

logger = logging.getLogger("urm_ray.data")

PAD_TOKEN, WALL_TOKEN, OPEN_TOKEN, START_TOKEN, GOAL_TOKEN, PATH_TOKEN = range(6)
VOCAB_SIZE = 6
CHARSET = "# SGo"  # the official data's characters of tokens 1..5
_CANDIDATES = 256  # mazes drawn per vectorised generation step


def _dilate(mask: np.ndarray) -> np.ndarray:
    """[B, n, n] bool: cells with a 4-neighbour in `mask`."""
    out = np.zeros_like(mask)
    out[:, 1:] |= mask[:, :-1]
    out[:, :-1] |= mask[:, 1:]
    out[:, :, 1:] |= mask[:, :, :-1]
    out[:, :, :-1] |= mask[:, :, 1:]
    return out


def _neighbour_sum(values: np.ndarray) -> np.ndarray:
    """[B, n, n]: sum of each cell's 4-neighbours' values."""
    out = np.zeros_like(values)
    out[:, 1:] += values[:, :-1]
    out[:, :-1] += values[:, 1:]
    out[:, :, 1:] += values[:, :, :-1]
    out[:, :, :-1] += values[:, :, 1:]
    return out


def bfs(
    passable: np.ndarray,
    start: np.ndarray,
    count_paths: bool = False,
    until: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Breadth-first search from `start` through `passable` cells, for a batch of grids at once.

    passable, start: [B, n, n] bool. Returns (distance [B, n, n] int32, -1 where unreachable or
    not searched; with `count_paths`, the number of shortest paths to each cell [B, n, n] int8
    capped at 2). With `until` [B, n, n] bool, the search may stop once every grid has reached
    its `until` cells (distances up to theirs are complete)."""
    dist = np.where(start, 0, -1).astype(np.int32)
    ways = start.astype(np.int8) if count_paths else None
    reached, frontier, step = start.copy(), start.copy(), 0
    while frontier.any():
        step += 1
        previous, frontier = frontier, _dilate(frontier) & passable & ~reached
        if ways is not None:
            layer_ways = _neighbour_sum(np.where(previous, ways, 0).astype(np.int8))  # <= 8
            ways = np.where(frontier, np.minimum(layer_ways, 2), ways).astype(np.int8)
        dist[frontier] = step
        reached |= frontier
        if until is not None and not (until & ~reached).any():
            break
    return dist, ways


def _cells(tokens: np.ndarray, n: int) -> np.ndarray:
    return np.asarray(tokens).reshape(-1, n, n)


def _neighbour_count(mask: np.ndarray) -> np.ndarray:
    """[B, n, n] int8: how many of each cell's 4-neighbours are in `mask`."""
    return _neighbour_sum(mask.astype(np.int8))


def _shortest_lengths(inputs: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
    """[B] shortest start-goal moves (-1 unreachable): read off the label's path when it marks
    one (builders check labels are shortest paths), by BFS for the other rows."""
    is_open, start, goal = (inputs == OPEN_TOKEN), inputs == START_TOKEN, inputs == GOAL_TOKEN
    shortest = np.full(len(inputs), -1, np.int64)
    search = np.ones(len(inputs), bool)
    if labels is not None:
        marked = ((labels == PATH_TOKEN) & is_open).sum(axis=(1, 2))
        search = marked == 0
        shortest[~search] = marked[~search] + 1
    if search.any():
        rows = np.flatnonzero(search)
        dist, _ = bfs((is_open | start | goal)[rows], start[rows], until=goal[rows])
        shortest[rows] = np.where(goal[rows], dist, -1).max(axis=(1, 2))
    return shortest


def valid_paths_mask(answers: Any, inputs: Any, n: int, labels: Any = None) -> np.ndarray:
    """[B] bool: each answer [B, n*n] is its input maze with one shortest start-goal path marked.

    The answer must keep every wall, start and goal of the input, mark only open cells as path,
    and mark exactly (shortest length - 1) cells such that each path cell has exactly two
    neighbours among path, start and goal cells, and start and goal exactly one. Those cells
    then form a start-goal path (no room is left for a detached loop), so a shortest one; every
    shortest path passes (a cell touching a third one would allow a shortcut). The shortest
    length comes from `labels` when given and marked, else from a BFS. A maze without exactly
    one start and one goal is never solved; one whose goal is unreachable is solved by marking
    no path."""
    answers, inputs = _cells(answers, n), _cells(inputs, n)
    labels = None if labels is None else _cells(labels, n)
    is_open = inputs == OPEN_TOKEN
    kept = np.where(is_open, (answers == OPEN_TOKEN) | (answers == PATH_TOKEN), answers == inputs)
    start, goal = inputs == START_TOKEN, inputs == GOAL_TOKEN
    well_formed = (start.sum(axis=(1, 2)) == 1) & (goal.sum(axis=(1, 2)) == 1)
    shortest = _shortest_lengths(inputs, labels)  # [B]
    on_path = (answers == PATH_TOKEN) & is_open
    path_cells = on_path.sum(axis=(1, 2))
    degree = _neighbour_count(on_path | start | goal)  # [B, n, n]
    chain = np.where(on_path, degree == 2, np.where(start | goal, degree == 1, True))
    connects = chain.all(axis=(1, 2)) & (path_cells == shortest - 1)
    solved = np.where(shortest < 0, path_cells == 0, connects)
    return kept.all(axis=(1, 2)) & well_formed & solved


def _trace_path(dist: np.ndarray, goal: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """[n, n] bool: the cells strictly between start and goal on one shortest path, walking back
    from the goal through cells one step closer to the start (random choice among ties)."""
    n = dist.shape[0]
    on_path = np.zeros((n, n), bool)
    row, col = goal
    for step in range(int(dist[goal]) - 1, 0, -1):
        options = [
            (r, c)
            for r, c in ((row - 1, col), (row + 1, col), (row, col - 1), (row, col + 1))
            if 0 <= r < n and 0 <= c < n and dist[r, c] == step
        ]
        row, col = options[rng.integers(len(options))]
        on_path[row, col] = True
    return on_path


def _perfect_maze(rooms: int, rng: np.random.Generator) -> np.ndarray:
    """[2 * rooms - 1]^2 bool open cells of a random perfect maze made by a randomised depth-first
    search (long winding corridors): room (i, j) is cell (2i, 2j), and a passage between two
    rooms opens the cell between them."""
    side = 2 * rooms - 1
    is_open = np.zeros((side, side), bool)
    visited = np.zeros((rooms, rooms), bool)
    stack = [(int(rng.integers(rooms)), int(rng.integers(rooms)))]
    visited[stack[0]] = True
    is_open[2 * stack[0][0], 2 * stack[0][1]] = True
    draws = iter(rng.random(4 * rooms * rooms))  # one draw per step: each room is pushed once
    while stack:
        r, c = stack[-1]
        options = [(r + dr, c + dc) for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))
                   if 0 <= r + dr < rooms and 0 <= c + dc < rooms and not visited[r + dr, c + dc]]
        if not options:
            stack.pop()
            continue
        nr, nc = options[int(next(draws) * len(options))]
        visited[nr, nc] = True
        is_open[2 * nr, 2 * nc] = is_open[r + nr, c + nc] = True
        stack.append((nr, nc))
    return is_open


def _draw_candidates(
    rng: np.random.Generator, count: int, n: int, loop_prob: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(walls, start, goal) [count, n, n] bool: corridor mazes with start and goal in two
    distinct rooms. Each is a perfect maze with every remaining wall between two rooms knocked
    down with probability `loop_prob` (loops make several routes, so the shortest one must be
    found); for even n the last row and column stay wall."""
    rooms = (n + 1) // 2
    side = 2 * rooms - 1
    is_open = np.zeros((count, n, n), bool)
    for i in range(count):
        is_open[i, :side, :side] = _perfect_maze(rooms, rng)
    between = np.zeros((n, n), bool)  # cells between two horizontally or vertically adjacent rooms
    between[:side:2, 1:side:2] = True
    between[1:side:2, :side:2] = True
    is_open |= between & (rng.random((count, n, n)) < loop_prob)
    picks = np.argsort(rng.random((count, rooms * rooms)), axis=1)[:, :2]  # two distinct rooms
    cell = 2 * (picks // rooms) * n + 2 * (picks % rooms)  # [count, 2] flat cell of each room
    start = np.zeros((count, n * n), bool)
    goal = np.zeros((count, n * n), bool)
    start[np.arange(count), cell[:, 0]] = True
    goal[np.arange(count), cell[:, 1]] = True
    return ~is_open, start.reshape(count, n, n), goal.reshape(count, n, n)


def _dihedral_key(maze: np.ndarray) -> bytes:
    """A key equal for the 8 rotations / reflections of a maze [n, n] (the smallest digest)."""
    views = [np.rot90(maze, k) for k in range(4)]
    views += [v.T for v in views]
    return min(hashlib.blake2b(np.ascontiguousarray(v).tobytes(), digest_size=12).digest()
               for v in views)


@dataclass(frozen=True)
class Filter:
    """Which drawn mazes are kept: a shortest path of at least `min_path` moves (and at most
    `max_path`, 0 = no limit), with each wall between two rooms knocked down with `loop_prob`, and
    with `unique_path` no second path as short."""

    min_path: int
    max_path: int = 0
    loop_prob: float = 0.03
    unique_path: bool = True


def generate_mazes(
    n: int, count: int, keep: Filter, *, seed: int = 0, max_candidates: int = 0
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yields (inputs, labels) token chunks [C, n*n] uint8 until `count` mazes are out.

    Memory is bounded by one chunk of `_CANDIDATES` candidates plus one 12-byte key per maze kept
    (for distinctness). Gives up with a DataError after `max_candidates` draws (default: 2000 per
    maze asked for) when the filter is too strict for the grid."""
    _check_arguments(n, count, keep)
    min_path, max_path, loop_prob, unique_path = (keep.min_path, keep.max_path, keep.loop_prob,
                                                  keep.unique_path)
    rng = np.random.default_rng(seed)
    max_candidates = max_candidates or 2000 * max(count, 1)
    seen: set[bytes] = set()
    drawn = kept = 0
    progress = Progress(f"maze {n}x{n} generate", count, unit="mazes",
                        every_s=DATA_PROGRESS_EVERY_S)
    while kept < count:
        if drawn >= max_candidates:
            raise DataError(
                f"maze {n}x{n}: only {kept}/{count} mazes passed the filter in {drawn} candidates"
                f" (min_path={min_path}, max_path={max_path}, loop_prob={loop_prob},"
                f" unique_path={unique_path}); loosen the filter"
            )
        walls, start, goal = _draw_candidates(rng, _CANDIDATES, n, loop_prob)
        drawn += _CANDIDATES
        dist, ways = bfs(~walls, start, count_paths=unique_path, until=goal)
        length = np.where(goal, dist, -1).max(axis=(1, 2))  # [C] moves, -1 unreachable
        ok = length >= max(min_path, 1)
        if max_path:
            ok &= length <= max_path
        if unique_path:
            ok &= np.where(goal, ways, 0).max(axis=(1, 2)) == 1
        inputs, labels = [], []
        for i in np.flatnonzero(ok)[: count - kept]:
            maze = np.where(walls[i], WALL_TOKEN, OPEN_TOKEN).astype(np.uint8)
            maze[start[i]], maze[goal[i]] = START_TOKEN, GOAL_TOKEN
            key = _dihedral_key(maze)
            if key in seen:
                continue
            seen.add(key)
            goal_cell = tuple(int(x) for x in np.argwhere(goal[i])[0])
            labelled = np.where(_trace_path(dist[i], goal_cell, rng), PATH_TOKEN, maze)
            inputs.append(maze.reshape(-1))
            labels.append(labelled.astype(np.uint8).reshape(-1))
        kept += len(inputs)
        progress.update(kept)
        if inputs:
            yield np.stack(inputs), np.stack(labels)
    progress.finish(kept)


def _check_arguments(n: int, count: int, keep: Filter) -> None:
    min_path, max_path, loop_prob = keep.min_path, keep.max_path, keep.loop_prob
    if not isinstance(n, int) or n < 2:
        raise ConfigError(f"n={n!r} must be an int >= 2")
    if count < 0:
        raise ConfigError(f"count={count} must be >= 0")
    if not 0 <= min_path < n * n:
        raise ConfigError(f"min_path={min_path} must be in [0, {n * n - 1}] for n={n}")
    if max_path and max_path < min_path:
        raise ConfigError(f"max_path={max_path} must be 0 (no limit) or >= min_path={min_path}")
    if not 0.0 <= loop_prob <= 1.0:
        raise ConfigError(f"loop_prob={loop_prob} must be in [0, 1]")


def build_generated(
    out_dir: str | os.PathLike,
    n: int,
    num_train: int,
    num_test: int,
    keep: Filter,
    *,
    seed: int = 0,
    overwrite: bool = False,
) -> DatasetMeta:
    """Generates distinct mazes and writes splits "train" and "test", streaming chunk by chunk.

    `puzzle_index` is the generation order within each split; test mazes come first from the
    stream, so the test split of a seed does not change with `num_train`."""
    for name, value in (("num_train", num_train), ("num_test", num_test)):
        if value < 0:
            raise ConfigError(f"{name}={value} must be >= 0")
    args = {"n": n, "num_train": num_train, "num_test": num_test, **asdict(keep)}
    chunks = generate_mazes(n, num_train + num_test, keep, seed=seed)
    splits = split_chunk_stream(chunks, {"test": num_test, "train": num_train})
    build = {"builder": "maze.build_generated", "arguments": args, "seed": seed, "source": None}
    meta = DatasetMeta(task=TASK.name, vocab_size=VOCAB_SIZE, seq_len=n * n,
                       num_puzzle_identifiers=1, augmentation=TASK.augmentation, build=build)
    return write_dataset_chunks(out_dir, splits, meta, overwrite=overwrite)


# CSV conversion: the official maze data (e.g. the HRM authors' maze-30x30-hard-1k) in the
# puzzle CSV layout, one character per cell from CHARSET, question without path, answer with it.


def _tokens(chars: np.ndarray, column: str, path: Path) -> np.ndarray:
    """Characters [N, L] -> tokens; DataError naming the row, cell and character of a bad one."""
    lut = np.zeros(256, np.uint8)
    lut[[ord(c) for c in CHARSET]] = np.arange(1, len(CHARSET) + 1)
    tokens = lut[chars]
    allowed = tokens != PAD_TOKEN
    if column == "question":
        allowed &= tokens != PATH_TOKEN
    if not allowed.all():
        row, cell = np.argwhere(~allowed)[0]
        expected = CHARSET.replace("o", "") if column == "question" else CHARSET
        raise DataError(
            f"{where(path, int(row) + 1)}: {column} has {chr(chars[row, cell])!r} at cell {cell},"
            f" expected one of {expected!r}"
        )
    return tokens


def _check_mazes(inputs: np.ndarray, labels: np.ndarray, n: int, path: Path) -> None:
    """DataError for the first row without exactly one S and G, an answer that changes the maze,
    or an answer that is not a shortest path."""
    for token, name in ((START_TOKEN, "start 'S'"), (GOAL_TOKEN, "goal 'G'")):
        counts = (inputs == token).sum(axis=1)
        if (counts != 1).any():
            row = int(np.argmax(counts != 1))
            raise DataError(f"{where(path, row + 1)}: question has {counts[row]} {name} cells,"
                            " expected 1")
    changed = (labels != inputs) & ~((inputs == OPEN_TOKEN) & (labels == PATH_TOKEN))
    if changed.any():
        row, cell = np.argwhere(changed)[0]
        raise DataError(
            f"{where(path, int(row) + 1)}: answer has {CHARSET[labels[row, cell] - 1]!r} at cell"
            f" {cell} where the question has {CHARSET[inputs[row, cell] - 1]!r}"
        )
    for start in range(0, len(inputs), _CANDIDATES):
        ok = valid_paths_mask(labels[start : start + _CANDIDATES], inputs[start : start + _CANDIDATES], n)
        if not ok.all():
            raise DataError(f"{where(path, start + int(np.argmin(ok)) + 1)}: answer is not a"
                            " shortest path from 'S' to 'G'")


def read_maze_csv(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, int]:
    """Validated (inputs, labels) tokens [N, n*n] uint8 and the side n from a maze CSV."""
    path = Path(path)
    table = read_csv_table(path)
    if table.num_rows == 0:
        raise DataError(f"{path}: no rows")
    first = len(table.column("question")[0].as_py() or "")
    n = math.isqrt(first)
    if n < 2 or n * n != first:
        raise DataError(f"{where(path, 1)}: question has {first} characters, expected n*n (a"
                        " square maze)")
    inputs = _tokens(char_matrix(table, "question", n * n, path), "question", path)
    labels = _tokens(char_matrix(table, "answer", n * n, path), "answer", path)
    _check_mazes(inputs, labels, n, path)
    return inputs, labels, n


def build_from_csv(
    out_dir: str | os.PathLike,
    train_csv: str | os.PathLike,
    test_csv: str | os.PathLike,
    *,
    overwrite: bool = False,
) -> DatasetMeta:
    """Converts official-layout maze CSVs into splits "train" and "test" (rows as in the files;
    `puzzle_index` is the 0-based data row)."""
    splits, sides = {}, {}
    for split, csv_path in (("train", train_csv), ("test", test_csv)):
        inputs, labels, sides[split] = read_maze_csv(csv_path)
        splits[split] = {"inputs": inputs, "labels": labels,
                         "puzzle_identifiers": np.zeros(len(inputs), np.int32),
                         "puzzle_index": np.arange(len(inputs))}
        logger.info("%s: %d mazes %dx%d", csv_path, len(inputs), sides[split], sides[split])
    if sides["train"] != sides["test"]:
        raise DataError(f"{test_csv}: mazes are {sides['test']}x{sides['test']}, but {train_csv}"
                        f" has {sides['train']}x{sides['train']}")
    n = sides["train"]
    source = {"train_csv": str(Path(train_csv).resolve()), "test_csv": str(Path(test_csv).resolve())}
    build = {"builder": "maze.build_from_csv", "arguments": {"n": n}, "seed": None,
             "source": source}
    meta = DatasetMeta(task=TASK.name, vocab_size=VOCAB_SIZE, seq_len=n * n,
                       num_puzzle_identifiers=1, augmentation=TASK.augmentation, build=build)
    return write_dataset(out_dir, splits, meta, overwrite=overwrite)


# --- verifier, builder command: the task's registry entry ------------------------------------------


def verifier(seq_len: int) -> NumpyCheck:
    """Answers that mark one shortest start-goal path of the input maze."""
    n = board_side("maze", seq_len)
    # the label's path length is the shortest length (builders check it), which spares a BFS
    return lambda answers, inputs, labels: valid_paths_mask(answers, inputs, n, labels)


def _build_command(args: argparse.Namespace) -> None:
    check_output_folder(args.out, args.overwrite)  # before reading any input
    if bool(args.train_csv) != bool(args.test_csv):
        raise ConfigError("--train-csv and --test-csv go together")
    if args.train_csv:
        build_from_csv(args.out, args.train_csv, args.test_csv, overwrite=args.overwrite)
    else:
        build_generated(
            args.out, n=args.size, num_train=args.num_train, num_test=args.num_test,
            keep=Filter(args.min_path, args.max_path, args.loop_prob, args.unique_path),
            seed=args.seed, overwrite=args.overwrite,
        )
    print(f"wrote {args.out}")


def add_builder(data: argparse._SubParsersAction) -> None:
    """`urm-ray data maze`."""
    m = data.add_parser("maze", help="generate n x n mazes labelled with their shortest path")
    m.add_argument("--out", required=True, help="dataset folder to create")
    m.add_argument("--size", type=int, default=30, help="maze side n (the papers: 30)")
    m.add_argument("--num-train", type=int, default=1000)
    m.add_argument("--num-test", type=int, default=1000)
    m.add_argument("--min-path", type=int, default=110,
                   help="hardness filter: keep mazes whose shortest path has >= this many moves")
    m.add_argument("--max-path", type=int, default=0, help="and <= this many (0 = no limit)")
    m.add_argument("--loop-prob", type=float, default=0.03,
                   help="chance to knock down each wall between two rooms (more routes)")
    m.add_argument("--unique-path", action=argparse.BooleanOptionalAction, default=True,
                   help="keep only mazes with a single shortest path (default: yes)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--train-csv", help="convert the official maze CSV (source,question,answer,"
                                       "rating; cells '# SGo') instead of generating")
    m.add_argument("--test-csv", help="held-out CSV (with --train-csv)")
    m.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --out")
    m.set_defaults(func=_build_command)


# walls, start, goal and path move together under the square's symmetries
TASK = PuzzleTask("maze", add_builder=add_builder, augmentation="dihedral", augment=dihedral,
                  verifier=verifier)
