"""How long a sweep trial on several Ray Train workers takes to start, against Ray Train's own floor.

    python bench/trial_start.py                 # 5 rounds of A and B, interleaved
    python bench/trial_start.py --quick         # 3 rounds
    python bench/trial_start.py --rounds 7 --json trial_start.json

A trial of several workers runs the Train driver inside its Tune trial actor: ``run_trial`` calls
``driver.fit``, which builds a ``TorchTrainer`` and waits on its ``fit()``. On one private local
Ray instance this runs, one round after another (A, B, A, B, ...), two Tune runs of two trials
each, run one after the other in one trial actor that Tune reuses, as a sweep runs them (the
first trial in a fresh actor, the second in the reused one):

    A  the floor: a ``TorchTrainer`` with 2 CPU workers whose loop only reports once, fitted in a
       Tune trial with Tune's report callback, as our trial fits its trainer
    B  our trial (``tune.trial.run_trial``): 2 CPU workers, a tiny sudoku4 URM, one optimizer
       step, the final evaluation on 16 rows, its checkpoint and its MLflow run (SQLite)

and times each from the trial's start (the trainable's entry, once it has imported what a reused
trial actor already holds: Ray Train for A, the driver for B) to

    first report  Tune's driver received the trial's first result. A: the no-op's report.
                  B: step 1's report, after the step, its evaluation and its checkpoint
    first step    B only: the first report less the evaluation's own seconds (``time/eval_s``)
    end           Tune's driver saw the trial complete

Every trial starts Ray Train's controller and a fresh process per worker (Ray Train keeps no
worker group between runs): the gap B - A is what is ours, from the workers' imports to Ray
Data's first batch. Medians over the rounds, and B's over A's. Measure on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from ray import tune

WORKERS = 2
TRIAL_CPUS = 0.1  # as a sweep's trial actor (tune.resources.TRIAL_CPUS)
CLUSTER_CPUS = 4  # logical: 2 workers + Ray Data's reserve + the trial actor
TINY = {"model.hidden_size": 16, "model.num_heads": 2, "model.num_layers": 1, "model.expansion": 1.0,
        "model.loops": 2, "model.truncation": 0, "model.max_segments": 1, "train.steps": 1,
        "train.global_batch_size": 16, "train.log_every": 1, "eval.every": 0,
        "checkpoint.every": 0, "eval.max_rows": 16, "resources.num_workers": WORKERS,
        "resources.cpus_per_worker": 1.0, "resources.in_process": False}


def _stamp_start(folder: Path, name: str) -> None:
    (folder / f"{name}.start").write_text(repr(time.time()))


def _noop_loop(config: dict[str, Any]) -> None:
    import ray.train

    ray.train.report({"step": 1})


def floor_trial(config: dict[str, Any], folder: str, round_: int) -> None:
    """A: Ray Train's floor, fitted in a Tune trial the way ``driver.fit`` fits our trainer."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from urm_ray.cluster import ray_train_defaults

    number = config["trial_number"]
    _stamp_start(Path(folder), f"A{round_}.{number}")
    ray_train_defaults()
    TorchTrainer(
        _noop_loop,
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ray.train.ScalingConfig(num_workers=WORKERS, resources_per_worker={"CPU": 1.0}),
        run_config=ray.train.RunConfig(name=f"floor-{round_}-{number}", storage_path=f"{folder}/train",
                                       callbacks=[TuneReportCallback()]),
    ).fit()


def our_trial(config: dict[str, Any], ctx: Any, folder: str, round_: int) -> None:
    """B: a sweep's trial of several workers (``run_trial``)."""
    from urm_ray.train import driver  # noqa: F401  (a reused trial actor holds it already)
    from urm_ray.tune.trial import run_trial

    _stamp_start(Path(folder), f"B{round_}.{config['trial_number']}")
    run_trial(config, ctx)


class Stamps(tune.Callback):
    """When Tune's driver got each trial's first result and saw it complete (unix s), by trial number."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.end: dict[int, float] = {}
        self.metrics: dict[int, dict[str, Any]] = {}

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        number = trial.config["trial_number"]
        if number not in self.first:
            self.first[number], self.metrics[number] = time.time(), dict(result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.end[trial.config["trial_number"]] = time.time()


def run_one(trainable: Any, folder: Path, name: str, numbers: tuple[int, int]) -> list[dict[str, float]]:
    """Two trials (``numbers``: their trial numbers, new in every round: B's trials resume nothing),
    one after the other in one trial actor that Tune reuses, as a sweep runs them: the times of a
    fresh actor's trial, then of the next one."""
    stamps = Stamps()
    tuner = tune.Tuner(
        tune.with_resources(trainable, tune.PlacementGroupFactory([{"CPU": TRIAL_CPUS}])),
        param_space={"trial_number": tune.grid_search(list(numbers))},
        tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(name=name, storage_path=str(folder / "tune"), callbacks=[stamps],
                                  verbose=0),
    )
    for result in tuner.fit():
        if result.error is not None:
            raise RuntimeError(f"{name} failed: {result.error}")
    trials = []
    for number in numbers:
        start = float((folder / f"{name}.{number}.start").read_text())
        assert number in stamps.first and number in stamps.end, f"{name}: no result of trial {number}"
        times = {"first report": stamps.first[number] - start, "end": stamps.end[number] - start}
        if "time/eval_s" in stamps.metrics[number]:
            times["first step"] = times["first report"] - float(stamps.metrics[number]["time/eval_s"])
        trials.append(times)
    return trials


def trial_context(folder: Path) -> Any:
    """A sweep's context for B's trials: the quickstart space, a parent run in a SQLite store."""
    from urm_ray import tracking
    from urm_ray.tracking import KIND_TAG
    from urm_ray.tune.space import load_space
    from urm_ray.tune.trial import TrialContext

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    parent = tracking.open_run(uri, "bench-start", "bench", {}, {KIND_TAG: "sweep"})
    extra = {**TINY, "data.path": "builtin:sudoku4", "checkpoint.storage_path": str(folder / "trials"),
             "tracking.tracking_uri": uri, "tracking.experiment": "bench-start"}
    return TrialContext("bench", load_space("quickstart"), extra, uri, "bench-start", parent)


TRIALS = ("fresh actor", "reused actor")  # a trial actor's first trial, then the next in it


def median_table(rows: dict[str, list[list[dict[str, float]]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Medians over the rounds: {A or B: {fresh actor or reused actor: {what: seconds}}}."""
    return {what: {trial: {key: statistics.median(r[i][key] for r in runs) for key in runs[0][i]}
                   for i, trial in enumerate(TRIALS)}
            for what, runs in rows.items()}


def render(medians: dict[str, dict[str, dict[str, float]]], rounds: int) -> str:
    lines = [f"median over {rounds} interleaved rounds, seconds from the trial's start"]
    for trial in TRIALS:
        a, b = medians["A"][trial], medians["B"][trial]
        lines += [f"{trial + ':':<34}{'first report':>13}{'first step':>12}{'end':>8}",
                  f"{'A  TorchTrainer no-op, 2 workers':<34}{a['first report']:>13.2f}{'-':>12}{a['end']:>8.2f}",
                  f"{'B  our trial, 2 workers':<34}{b['first report']:>13.2f}"
                  f"{b.get('first step', float('nan')):>12.2f}{b['end']:>8.2f}",
                  f"{'B / A':<34}{b['first report'] / a['first report']:>13.2f}"
                  f"{b.get('first step', float('nan')) / a['first report']:>12.2f}{b['end'] / a['end']:>8.2f}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of A then B (at least 3)")
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--json", help="also write the rounds and medians here")
    args = parser.parse_args()
    rounds = 3 if args.quick else max(3, args.rounds)

    from urm_ray.cluster import init_ray

    init_ray(num_cpus=CLUSTER_CPUS)
    rows: dict[str, list[list[dict[str, float]]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory(prefix="trial_start-") as scratch:
        folder = Path(scratch)
        ctx = trial_context(folder)
        for round_ in range(rounds):
            numbers = (2 * round_, 2 * round_ + 1)
            rows["A"].append(run_one(partial(floor_trial, folder=scratch, round_=round_), folder, f"A{round_}",
                                     numbers))
            rows["B"].append(run_one(partial(our_trial, ctx=ctx, folder=scratch, round_=round_), folder,
                                     f"B{round_}", numbers))
            shown = ", ".join(f"{w} {rows[w][-1][0]['end']:.2f} / {rows[w][-1][1]['end']:.2f} s" for w in "AB")
            print(f"round {round_ + 1}/{rounds} (fresh / reused actor): {shown}", flush=True)
    medians = median_table(rows)
    print(render(medians, rounds))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rows, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
