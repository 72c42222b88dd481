"""Data-layer throughput: Sudoku generation (puzzles/s) and the Ray Data stream (rows/s).

    python bench/data_pipeline.py --size 9 --blanks 45 --puzzles 200 --rows 100000 --num-cpus 2

The stream is measured on a dataset of `--rows` stored puzzles made by augmenting a few generated
ones (the pipeline does not care whether they are distinct), read with `--augmentations` slots each.
"""

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import ray

from urm_ray.data import augment, store, stream
from urm_ray.data.config import DataConfig
from urm_ray.data.tasks import sudoku


def bench_generation(size: int, blanks: int, count: int) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    sudoku.generate_puzzles(size, count, blanks, seed=0)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(
        f"generate {size}x{size} blanks={blanks}: {count / wall:.0f} puzzles/s wall, "
        f"{count / cpu:.0f} per CPU-second ({count} puzzles)"
    )


def synthetic_dataset(folder: Path, size: int, blanks: int, rows: int) -> None:
    """`rows` stored puzzles: augmentations of 16 generated ones."""
    questions, solutions = sudoku.generate_puzzles(size, 16, blanks, seed=0)
    source = np.arange(rows) % 16
    inputs, labels = augment.augment_batch(
        sudoku.augment, questions[source] + 1, solutions[source] + 1, source, np.arange(rows) // 16, 0
    )
    cols = {
        "inputs": inputs,
        "labels": labels,
        "puzzle_identifiers": np.zeros(rows, np.int32),
        "puzzle_index": np.arange(rows),
    }
    meta = store.DatasetMeta(
        task="sudoku",
        vocab_size=size + 2,
        seq_len=size * size,
        num_puzzle_identifiers=1,
        augmentation="sudoku",
    )
    store.write_dataset(folder, {"train": cols, "test": cols}, meta)


def bench_stream(folder: Path, augmentations: int, batch_size: int, epochs: int = 3) -> None:
    cfg = DataConfig(path=str(folder), num_augmentations=augmentations)
    start = time.perf_counter()
    dataset = stream.train_dataset(cfg)  # reads the stored rows into the object store
    print(f"stream setup (read + materialize): {time.perf_counter() - start:.1f} s")
    for epoch in range(epochs):
        start = time.perf_counter()
        first, rows = None, 0
        for batch in stream.iter_torch_batches(dataset, batch_size, epoch=epoch):
            first = first or time.perf_counter() - start
            rows += len(batch["inputs"])
        wall = time.perf_counter() - start
        print(
            f"stream epoch {epoch}: {rows} rows in {wall:.1f} s = {rows / wall:.0f} rows/s, "
            f"first batch after {first:.1f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=9)
    parser.add_argument("--blanks", type=int, default=45)
    parser.add_argument("--puzzles", type=int, default=200, help="puzzles to generate (0 = skip)")
    parser.add_argument(
        "--rows", type=int, default=100_000, help="stored rows to stream (0 = skip)"
    )
    parser.add_argument("--augmentations", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-cpus", type=int, default=2)
    args = parser.parse_args()
    if args.puzzles:
        bench_generation(args.size, args.blanks, args.puzzles)
    if args.rows:
        with tempfile.TemporaryDirectory() as tmp:
            synthetic_dataset(Path(tmp) / "d", args.size, args.blanks, args.rows)
            ray.init(address="local", num_cpus=args.num_cpus, logging_level=logging.WARNING)
            try:
                bench_stream(Path(tmp) / "d", args.augmentations, args.batch_size)
            finally:
                ray.shutdown()


if __name__ == "__main__":
    main()
