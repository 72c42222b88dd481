"""ARC-AGI data: our build (time, peak RAM, disk) and the augmented stream (rows/s per CPU).

    python bench/arc_build.py --source ../shared/data/arc-agi --num-cpus 2 --json arc_build.json

1. `urm-ray data arc` (training + evaluation, evaluation held out) runs in a child process: wall
   and CPU time, the child's peak RSS (getrusage RUSAGE_CHILDREN), and the dataset's size on disk.
2. The augmentation alone (numpy, this process): augmented rows per CPU-second, 1000-slot table.
3. The Ray Data stream (`stream.train_dataset`, 1001 slots per task): rows/s in the driver after
   the first batch, and per CPU given to Ray.
4. What a training step consumes: the paper's global batch (768 rows) per step; the step rate at
   which the stream would fall behind is stream rows/s / 768.

The official builder (HRM/TRM `build_arc_dataset.py`, ARC-AGI-1 training + evaluation + ConceptARC,
1000 augmentations materialised) took 9 min, 15.5 GB peak RAM and 6.8 GB disk on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

OFFICIAL = {"build_s": 9 * 60, "peak_ram_gb": 15.5, "disk_gb": 6.8, "cores": 2}
PAPER_BATCH = 768


def bench_build(source: str, out: Path, subsets: list[str], test_set: str) -> dict[str, float]:
    """Builds in a child process; wall / CPU seconds, the child's peak RSS and the folder size."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "urm_ray.cli", "data", "arc", "--source", source, "--out",
           str(out), "--subsets", *subsets, "--test-set", test_set]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"build_wall_s": wall, "build_cpu_s": cpu, "build_peak_rss_mb": after.ru_maxrss / 1024,
            "disk_mb": disk / 2**20}


def bench_augment(folder: Path, rows: int, slots: int = 1001) -> dict[str, float]:
    """Augmented rows per CPU-second of `arc_augment.augment` (with translation), in-process."""
    from urm_ray.data import store
    from urm_ray.data.tasks import arc
    from urm_ray.data.tasks.arc import augment as arc_augment

    table, train = arc.load_tasks(folder), store.read_split(folder, "train")
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(train["inputs"]), rows)
    aug = rng.integers(0, slots, rows).astype(np.int32)
    cpu, wall = time.process_time(), time.perf_counter()
    for start in range(0, rows, 16384):
        sel = slice(start, start + 16384)
        src = pick[sel]
        picked = {key: column[src] for key, column in train.items()}
        arc_augment.augment(picked, aug[sel], 0, table, slots, True)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"augment_rows_per_cpu_s": rows / cpu, "augment_rows_per_s": rows / wall}


def bench_stream(folder: Path, rows: int, num_cpus: int, batch_size: int = 768) -> dict[str, float]:
    """Ray Data stream rate in the driver (rows/s after the first batch), 1001 slots per task."""
    import ray

    from urm_ray.data import stream
    from urm_ray.data.config import DataConfig

    ray.init(address="local", num_cpus=num_cpus, logging_level=logging.WARNING)
    try:
        cfg = DataConfig(path=str(folder), num_augmentations=1001)
        start = time.perf_counter()
        first, seen, t_first = None, 0, 0.0
        for batch in stream.iter_torch_batches(stream.train_dataset(cfg), batch_size,
                                               device="cpu"):
            if first is None:
                first, t_first = time.perf_counter() - start, time.perf_counter()
            else:
                seen += len(batch["inputs"])
            if seen >= rows:
                break
        rate = seen / (time.perf_counter() - t_first)
    finally:
        ray.shutdown()
    return {"stream_first_batch_s": first, "stream_rows_per_s": rate,
            "stream_rows_per_s_per_cpu": rate / num_cpus,
            "steps_per_s_fed_at_batch_768": rate / PAPER_BATCH}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=str(Path(__file__).resolve().parents[2] / "shared"
                                                / "data" / "arc-agi"))
    parser.add_argument("--subsets", nargs="+", default=["training", "evaluation"])
    parser.add_argument("--test-set", default="evaluation")
    parser.add_argument("--augment-rows", type=int, default=200_000)
    parser.add_argument("--stream-rows", type=int, default=200_000, help="0 = skip the stream")
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--json", default="", help="write the results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "arc1"
        result = bench_build(args.source, folder, args.subsets, args.test_set)
        print(f"build: {result['build_wall_s']:.1f} s wall, {result['build_cpu_s']:.1f} s CPU,"
              f" peak RSS {result['build_peak_rss_mb']:.0f} MB, disk {result['disk_mb']:.1f} MB"
              f" (official: {OFFICIAL['build_s']} s, {OFFICIAL['peak_ram_gb']} GB,"
              f" {OFFICIAL['disk_gb']} GB)")
        result.update(bench_augment(folder, args.augment_rows))
        print(f"augment: {result['augment_rows_per_cpu_s']:.0f} rows per CPU-second")
        if args.stream_rows:
            result.update(bench_stream(folder, args.stream_rows, args.num_cpus))
            print(f"stream: {result['stream_rows_per_s']:.0f} rows/s"
                  f" ({result['stream_rows_per_s_per_cpu']:.0f} per CPU), first batch after"
                  f" {result['stream_first_batch_s']:.1f} s; feeds"
                  f" {result['steps_per_s_fed_at_batch_768']:.1f} steps/s at batch 768")
    result["official"] = OFFICIAL
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
