"""Sweep efficiency: ASHA + TPE against random search without pruning, same task and budget.

    python bench/sweep_efficiency.py quickstart --target 0.8 --repeats 2 --json out.json
    python bench/sweep_efficiency.py quickstart trials=8 train.steps=200 --target 0.3,0.5

Each arm is a real sweep (the same code as ``urm-ray sweep``) over the same space and number of
trials, on a private local Ray instance:

    asha-tpe       TPE + ASHA, stopped trials told to Optuna as PRUNED (what urm-ray does)
    asha-tpe-ray   TPE + ASHA, stopped trials told as COMPLETE with their early value
                   (Ray's OptunaSearch behaviour; TPE then models short runs as finished ones)
    random         random search, no pruning: every trial trains to the end

Measured per sweep, from every report Tune receives: the trial-steps spent (optimizer steps summed
over all trials, counted up to each trial's latest report) when the primary metric first reaches
each ``--target``, the trial-steps of the whole sweep, the best value, pruned trials and wall time.
Trial-steps do not depend on the machine's speed or load; wall time does. Repeats use sampler
seeds 0, 1, ...

    python bench/sweep_efficiency.py quickstart --simulate 20

isolates the PRUNED-vs-COMPLETE question in seconds: TPE + a sequential ASHA over one parameter
(log lr) on a synthetic learning curve where high rates start fast but plateau low, 30 trials,
averaged over 20 seeds; it reports the best final accuracy found, the trial-steps spent and the
share of trials TPE put in the fast-starting region.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
import ray
from ray import tune

from urm_ray.cluster import init_ray
from urm_ray.tune.sweep import create_sweep, run_sweep
from urm_ray.tune.trial import split_config

ARMS = {
    "asha-tpe": ["search.sampler=tpe", "search.pruned_as=pruned"],
    "asha-tpe-ray": ["search.sampler=tpe", "search.pruned_as=complete"],
    "random": ["search.sampler=random", "scheduler.name=none"],
}


class StepLog(tune.Callback):
    """Records (seconds, trial, step, metric) for every result Tune receives."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.start = time.monotonic()
        self.rows: list[tuple[float, int, int, float | None]] = []

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        number, _ = split_config(trial.config)
        self.rows.append((time.monotonic() - self.start, number, int(result.get("step", 0)),
                          result.get(self.metric)))


def steps_to_target(rows: list[tuple[float, int, int, float | None]], target: float,
                    mode: str) -> int | None:
    """Trial-steps spent when the metric first reaches the target (None if it never does)."""
    latest: dict[int, int] = {}
    for _, trial, step, value in sorted(rows):
        latest[trial] = max(latest.get(trial, 0), step)
        if value is not None and (value >= target if mode == "max" else value <= target):
            return sum(latest.values())
    return None


def run_arm(space: str, overrides: list[str], arm: str, seed: int, targets: list[float],
            root: Path) -> dict[str, Any]:
    info, sweep_space = create_sweep(space, [*overrides, *ARMS[arm], f"search.seed={seed}",
                                             f"tracking.tracking_uri=sqlite:///{root / 'mlflow.db'}"],
                                     name=f"{arm}-s{seed}", root=str(root))
    log = StepLog(sweep_space.metric)
    started = time.monotonic()
    outcome = run_sweep(info, sweep_space, callbacks=[log])
    fates = [t.user_attrs.get("fate", t.state.name.lower()) for t in info.study().trials]
    last: dict[int, int] = {}
    for _, trial, step, _ in log.rows:
        last[trial] = max(last.get(trial, 0), step)
    return {
        "arm": arm, "seed": seed, "trials": len(fates), "pruned": fates.count("pruned"),
        "steps_to_target": {str(t): steps_to_target(log.rows, t, sweep_space.mode) for t in targets},
        "total_trial_steps": sum(last.values()), "best": outcome.best_value,
        "wall_s": round(time.monotonic() - started, 1), "reports": log.rows,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        row: dict[str, Any] = {}
        for target in mine[0]["steps_to_target"]:
            reached = [r["steps_to_target"][target] for r in mine if r["steps_to_target"][target] is not None]
            row[f"target {target}: reached"] = f"{len(reached)}/{len(mine)}"
            row[f"target {target}: mean trial-steps"] = statistics.fmean(reached) if reached else None
        bests = [r["best"] for r in mine if r["best"] is not None]
        row.update({
            "mean_total_trial_steps": statistics.fmean(r["total_trial_steps"] for r in mine),
            "mean_best": statistics.fmean(bests) if bests else None,
            "mean_pruned": statistics.fmean(r["pruned"] for r in mine),
            "mean_wall_s": statistics.fmean(r["wall_s"] for r in mine),
        })
        out[arm] = row
    return out


def _curve(log_lr: float, step: int) -> float:
    """Synthetic held-out accuracy: high lrs start fast but plateau low, the best lr starts slow."""
    final = max(0.05, 0.95 - 0.5 * (log_lr + 3.5) ** 2)
    speed = 0.01 * 10 ** (log_lr + 3)  # per step
    return final * (1 - math.exp(-speed * step))


def simulate(pruned_as: str, seed: int, trials: int = 30, steps: int = 400,
             rungs: tuple[int, ...] = (50, 100, 200)) -> dict[str, float]:
    """One TPE + ASHA (reduction 2) sweep over lr on ``_curve``, with stopped trials told to
    Optuna as PRUNED or, like Ray's OptunaSearch, as COMPLETE with their early value."""
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    recorded: dict[int, list[float]] = {r: [] for r in rungs}
    best, spent, fast = 0.0, 0, 0
    for _ in range(trials):
        trial = study.ask()
        log_lr = trial.suggest_float("log_lr", -4.0, -2.0)
        fast += log_lr > -2.8  # the fast-starting, low-plateau region
        stop = steps
        for rung in rungs:
            value = _curve(log_lr, rung)
            trial.report(value, rung)
            cutoff = sorted(recorded[rung], reverse=True)[: max(1, len(recorded[rung]) // 2)]
            recorded[rung].append(value)
            if cutoff and value < cutoff[-1]:
                stop = rung
                break
        spent += stop
        value = _curve(log_lr, stop)
        best = max(best, value) if stop == steps else best
        if stop < steps and pruned_as == "pruned":
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, value)
    return {"best": best, "trial_steps": spent, "fast_start_share": fast / trials}


def run_simulation(repeats: int) -> dict[str, Any]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = {}
    for pruned_as in ("pruned", "complete"):
        runs = [simulate(pruned_as, seed) for seed in range(repeats)]
        out[pruned_as] = {key: statistics.fmean(r[key] for r in runs) for key in runs[0]}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("space", help="search space (YAML path or a shipped space's name)")
    parser.add_argument("overrides", nargs="*", help="space or config overrides, as for urm-ray sweep")
    parser.add_argument("--target", default="",
                        help="value(s) of the primary metric to reach, comma-separated")
    parser.add_argument("--repeats", type=int, default=1, help="sweeps per arm (sampler seeds 0..)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {list(ARMS)}")
    parser.add_argument("--cpus", type=int, default=0, help="CPUs of the private Ray instance (0 = all)")
    parser.add_argument("--dir", default="", help="keep the sweeps here (default: a temporary folder)")
    parser.add_argument("--json", default="", help="write the results to this file")
    parser.add_argument("--simulate", type=int, default=0, metavar="REPEATS",
                        help="instead: the PRUNED-vs-COMPLETE effect on TPE over a synthetic "
                             "learning curve, averaged over REPEATS seeds (seconds, no Ray)")
    args = parser.parse_args(argv)
    if args.simulate:
        result = run_simulation(args.simulate)
        print(json.dumps(result, indent=2))
        return result
    targets = [float(t) for t in args.target.split(",")]
    init_ray(num_cpus=args.cpus or None)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.dir or scratch).resolve()
        for seed in range(args.repeats):
            for arm in args.arms.split(","):
                runs.append(run_arm(args.space, args.overrides, arm, seed, targets, root))
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "reports"}), flush=True)
    result = {"space": args.space, "overrides": args.overrides, "targets": targets,
              "runs": runs, "summary": summarize(runs)}
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    ray.shutdown()
    return result


if __name__ == "__main__":
    main()
