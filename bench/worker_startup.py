"""Where the start-up of a run on several Ray Train workers goes: every process it starts, and when.

    python bench/worker_startup.py                          # 2 workers, the scale bench's tiny trial
    python bench/worker_startup.py --workers 4 --set model.loops=4 --json startup.json

A run (or a sweep's trial) on several workers starts Ray Train's controller, its helper actors and
a fresh worker process per worker, then Ray Data's actors and tasks, every time: Ray Train keeps no
worker group from one run to the next. This runs ``driver.fit`` once, with the workers as Ray
Train actors, on a private local Ray instance, then reads from Ray's state API each actor's
creation task (queued, started, its ``__init__`` done) and the first training function call and
Ray Data task, as seconds from the start of ``fit``:

    actor               queued  started  ready    the actor's process came up at "started";
                                                  "ready" - "started" is mostly its imports
    training function   when the workers entered the loop (their imports of urm_ray follow)
    first data task     when Ray Data started its first task for the run

The run's config is the scale bench's tiny trial (``bench/sweep_scale.py``) unless ``--set``
changes it. Measure on an idle machine: every process imports Ray Train or torch, so the figures
scale with the CPU that is free.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ray.util.state import list_tasks

from urm_ray.cluster import init_ray
from urm_ray.config import load_config
from urm_ray.train.driver import fit

TINY = ["data.path=builtin:sudoku4", "model.hidden_size=16", "model.num_heads=2", "model.num_layers=1",
        "model.expansion=1.0", "model.max_segments=2", "train.steps=20", "train.global_batch_size=16",
        "train.log_every=10", "eval.every=10", "checkpoint.every=10",
        "eval.max_rows=16", "resources.in_process=false"]
TRAINING_FUNCTION = "execute.chdir_to_working_dir"  # Ray Train's last set-up call before the loop


@dataclass
class Started:
    what: str
    queued_s: float
    started_s: float
    ready_s: float


def timeline(since: float) -> tuple[list[Started], int]:
    """Actors created after ``since`` (unix s), the first training function call and Ray Data
    task, in start order; and the number of distinct processes that ran a task."""
    tasks = list_tasks(address=os.environ["RAY_API_SERVER_ADDRESS"], detail=True, limit=10_000,
                       raise_on_missing_output=False)
    def rel(ms: int | None) -> float:
        return (ms or 0) / 1000 - since

    rows, firsts = [], {}
    for task in tasks:
        if not task.creation_time_ms or task.creation_time_ms / 1000 < since:
            continue
        if task.type == "ACTOR_CREATION_TASK":
            rows.append(Started(task.name.split(":")[-1].removesuffix(".__init__"),
                                rel(task.creation_time_ms), rel(task.start_time_ms), rel(task.end_time_ms)))
        elif task.name == TRAINING_FUNCTION or task.type == "NORMAL_TASK" and task.name.startswith("MapBatches"):
            what = "training function" if task.name == TRAINING_FUNCTION else "first data task"
            first = firsts.get(what)
            if first is None or task.creation_time_ms < first.creation_time_ms:
                firsts[what] = task
    rows += [Started(what, rel(t.creation_time_ms), rel(t.start_time_ms), rel(t.end_time_ms))
             for what, t in firsts.items()]
    processes = len({t.worker_pid for t in tasks if t.worker_pid and t.creation_time_ms
                     and t.creation_time_ms / 1000 >= since})
    return sorted(rows, key=lambda r: r.started_s), processes


def render(rows: list[Started], fit_s: float, processes: int, workers: int) -> str:
    lines = [f"{'':34s} {'queued':>7s} {'started':>8s} {'ready':>7s} {'ready-started':>14s}"]
    for row in rows:
        lines.append(f"{row.what:34s} {row.queued_s:7.2f} {row.started_s:8.2f} {row.ready_s:7.2f} "
                     f"{row.ready_s - row.started_s:14.2f}")
    kinds = Counter(r.what for r in rows if r.what not in ("training function", "first data task"))
    lines.append(f"fit: {fit_s:.1f} s with {workers} workers; {sum(kinds.values())} actors "
                 f"({', '.join(f'{n} x {k}' if n > 1 else k for k, n in kinds.items())}); "
                 f"{processes} processes ran its tasks")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpus-per-worker", type=float, default=0.5)
    parser.add_argument("--set", nargs="*", default=[], help="config overrides after the tiny trial's")
    parser.add_argument("--json", default="", help="also write the timeline to this file")
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error(f"--workers {args.workers}: a run of one worker trains in its own process")
    with tempfile.TemporaryDirectory(prefix="urm-ray-startup-") as folder:
        work = Path(folder)
        cfg = load_config("sudoku4-urm", [*TINY, f"resources.num_workers={args.workers}",
                                          f"resources.cpus_per_worker={args.cpus_per_worker}",
                                          f"checkpoint.storage_path={work / 'runs'}",
                                          f"tracking.tracking_uri=sqlite:///{work / 'mlflow.db'}", *args.set])
        init_ray(verbose=False, dashboard=True)  # the state API is the dashboard's
        started = time.time()
        fit(cfg)
        fit_s = time.time() - started
    time.sleep(2.0)  # task events reach the state API every second
    rows, processes = timeline(started)
    print(render(rows, fit_s, processes, args.workers))
    report = {"fit_s": fit_s, "workers": args.workers, "processes": processes,
              "timeline": [asdict(r) for r in rows]}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
