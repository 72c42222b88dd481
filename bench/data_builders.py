"""Dataset builders end to end (generate or convert, validate, write Parquet) and verifiers, in
rows per second, on one process.

    python bench/data_builders.py                         # every builder, small counts
    python bench/data_builders.py --only maze --mazes 200

Sudoku CSV conversion is measured on a synthetic Sudoku-Extreme-style CSV of `--csv-rows` rows
(augmentations of a few generated 9x9 puzzles, distinct as boards), converted with the papers'
"1k" subsample.
"""

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from urm_ray.data import augment
from urm_ray.data.tasks import coloring, maze, nqueens, sudoku
from urm_ray.data.tasks.verify import verifier_for


def _timed(name: str, rows: int, fn: Callable[[], object]) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"{name}: {rows} rows in {wall:.1f} s = {rows / wall:,.0f} rows/s wall,"
          f" {rows / cpu:,.0f} per CPU-second")


def _sudoku_csv(path: Path, rows: int) -> None:
    questions, solutions = sudoku.generate_puzzles(9, 8, 45, seed=0)
    source = np.arange(rows) % 8
    inputs, labels = augment.augment_batch(
        sudoku.augment, questions[source] + 1, solutions[source] + 1, source, np.arange(rows) // 8 + 1, 0
    )
    with path.open("w") as out:
        out.write("source,question,answer,rating\n")
        for q, a in zip(inputs - 1, labels - 1):
            out.write(f"bench,{''.join(map(str, q)).replace('0', '.')},{''.join(map(str, a))},0\n")


def bench_builders(args: argparse.Namespace, tmp: Path) -> None:
    if args.only in ("", "sudoku"):
        _sudoku_csv(tmp / "train.csv", args.csv_rows)
        _sudoku_csv(tmp / "test.csv", 1000)
        _timed(f"sudoku CSV -> 1k subsample ({args.csv_rows} + 1000 rows read)",
               args.csv_rows + 1000,
               lambda: sudoku.build_from_csv(tmp / "s", tmp / "train.csv", tmp / "test.csv",
                                             subsample=1000, num_augmentations=1001))
    if args.only in ("", "maze"):
        _timed(f"maze 30x30 min_path=110 unique ({args.mazes} mazes)", args.mazes,
               lambda: maze.build_generated(tmp / "m", 30, args.mazes // 2,
                                            args.mazes - args.mazes // 2, maze.Filter(min_path=110)))
    if args.only in ("", "coloring"):
        _timed(f"coloring n=12 k=3 ({args.graphs} graphs)", args.graphs,
               lambda: coloring.build_generated(tmp / "c", 12, 3, args.graphs - 1000, 1000))
    if args.only in ("", "nqueens"):
        rows = 724 * 65  # n=10: 724 solutions, 64 copies in train + 1 in test
        _timed("nqueens n=10 (all 724 solutions, 64 repeats)", rows,
               lambda: nqueens.build_unconditional(tmp / "q", 10, repeats=64))


def bench_verifiers(tmp: Path) -> None:
    inputs, labels = next(maze.generate_mazes(30, 256, maze.Filter(min_path=110), seed=1))
    cases = {
        "maze 30x30": (inputs, labels),
        "coloring n=12": next(coloring.generate_graphs(12, 4096, colors=3, edge_prob=0.4)),
        "nqueens n=8": (np.ones((4096, 64)), nqueens.solutions(8)[np.arange(4096) % 92]),
    }
    questions, solutions = sudoku.generate_puzzles(9, 16, 45, seed=0)
    cases["sudoku 9x9"] = (np.tile(questions + 1, (256, 1)), np.tile(solutions + 1, (256, 1)))
    for name, (x, y) in cases.items():
        x, y = torch.as_tensor(np.asarray(x)).long(), torch.as_tensor(np.asarray(y)).long()
        verify = verifier_for(name.split()[0], x.shape[1])
        _timed(f"verify {name}", len(x), lambda: verify(y, x, y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", choices=["", "sudoku", "maze", "coloring", "nqueens"])
    parser.add_argument("--csv-rows", type=int, default=100_000)
    parser.add_argument("--mazes", type=int, default=100)
    parser.add_argument("--graphs", type=int, default=50_000)
    parser.add_argument("--no-verifiers", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench_builders(args, Path(tmp))
        if not args.no_verifiers and not args.only:
            bench_verifiers(Path(tmp))


if __name__ == "__main__":
    main()
