"""How TPE's ask grows with the finished trials of a study, alone in one process.

    python bench/tpe_ask.py                                  # SQLite in a temporary folder
    python bench/tpe_ask.py --storage postgresql://postgres@127.0.0.1:5432/tpe

A study with the sweep's sampler (``search.make_sampler``: multivariate TPE, constant liar) and a
three-parameter space (two ints and a log-uniform float, as the scale benchmark's) gets
``--running`` trials left running, then finished trials added up to each of ``--points``; at
each point ``--asks`` new trials are asked, suggested and told, and the median CPU and wall time
of one ask + suggest is printed. CPU time is this process's alone, so it holds on a loaded
machine; the gap to wall time is the database's round trips (and the load). The sweep's driver
does this once per new trial (``SweepSearch.suggest``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import optuna

from urm_ray.tune.space import load_space
from urm_ray.tune.search import make_sampler

DISTRIBUTIONS = {"loops": optuna.distributions.IntDistribution(2, 8),
                 "truncation": optuna.distributions.IntDistribution(0, 4),
                 "lr": optuna.distributions.FloatDistribution(1e-4, 3e-3, log=True)}


def suggest(trial: optuna.Trial) -> None:
    trial.suggest_int("loops", 2, 8)
    trial.suggest_int("truncation", 0, 4)
    trial.suggest_float("lr", 1e-4, 3e-3, log=True)


def finished(rng: random.Random, n: int) -> list[optuna.trial.FrozenTrial]:
    """n finished trials with values and two intermediate values each (as ASHA leaves them)."""
    return [optuna.trial.create_trial(
        params={"loops": rng.randint(2, 8), "truncation": rng.randint(0, 4), "lr": 10 ** rng.uniform(-4, -2.6)},
        distributions=DISTRIBUTIONS, value=rng.random(),
        intermediate_values={10: rng.random(), 20: rng.random()}) for _ in range(n)]


def measure(storage: str, points: list[int], running: int, asks: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    space = load_space("quickstart", [])  # its search settings (seed, startup trials), not its params
    study = optuna.create_study(study_name=f"tpe-ask-{time.time_ns()}", storage=storage,
                                sampler=make_sampler(space), direction="maximize")
    for _ in range(running):
        suggest(study.ask())
    have, rows = 0, []
    for point in points:
        study.add_trials(finished(rng, max(point - have, 0)))
        have = max(point, have)
        cpu, wall = [], []
        for _ in range(asks):
            w, c = time.perf_counter(), time.process_time()
            trial = study.ask()
            suggest(trial)
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
            study.tell(trial, rng.random())
            have += 1
        rows.append({"finished": point, "cpu_ms": 1e3 * statistics.median(cpu),
                     "wall_ms": 1e3 * statistics.median(wall)})
        print(f"{point:6d} finished: ask + suggest {rows[-1]['cpu_ms']:6.1f} ms CPU, "
              f"{rows[-1]['wall_ms']:6.1f} ms wall", flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--storage", help="an Optuna storage URL (default: SQLite in a temporary folder)")
    p.add_argument("--points", default="10,100,400,800,1600", help="finished trials to measure at")
    p.add_argument("--running", type=int, default=16, help="trials left running (the concurrency)")
    p.add_argument("--asks", type=int, default=8, help="asks timed at each point")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    try:
        points = sorted(int(x) for x in args.points.split(","))
    except ValueError:
        points = []
    if not points or points[0] < 0:
        raise SystemExit(f"--points {args.points!r}: expected counts >= 0 separated by commas, e.g. 10,100,1000")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    with tempfile.TemporaryDirectory() as folder:
        rows = measure(args.storage or f"sqlite:///{folder}/tpe.db", points, args.running, args.asks, args.seed)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
