"""Where a sweep trial's fixed cost goes, phase by phase, in one long-lived process.

    python bench/trial_phases.py                           # quickstart's base config, 6 trials
    python bench/trial_phases.py --trials 10 --steps 20 --set model.loops=4

A one-worker trial trains in its Tune trial actor, which Tune reuses for the next trial: so the
process, its imports and Ray are paid once, and each trial then pays the phases below. This runs
those phases as ``driver.fit`` (a sweep's one-worker trial) and ``loop.run_loop`` do, one trial after another in this
process (the checkpoint goes to a local folder, as Tune persists it on local storage), and prints
the median of each phase over the trials after the first (the first pays the imports' lazy
parts and Ray Data's first start):

    prepare        resolve the config, read the dataset's metadata, probe the storage
    mlflow open    create the nested run, its params, config.yaml and the dataset record
    datasets       the train and eval Ray Datasets (small splits: into the object store)
    model build    model, optimizers, EMA
    first batch    Ray Data's first training batch (the pipeline starts)
    training       the trial's own steps (``--steps``)
    evaluation     the held-out evaluation (its own pipeline pass)
    checkpoint     state.pt + config.yaml written and persisted
    mlflow close   the checkpoint tag, the checkpoint artifact, the run closed

The trial's own work is training + evaluation; the rest is its overhead.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray
import torch

from urm_ray import tracking
from urm_ray.train.evaluation import InRun
from urm_ray.train import checkpoint
from urm_ray.train.hosts import ProcessHost
from urm_ray.train.live import Sender
from urm_ray.train.batches import TrainBatches
from urm_ray.train.loop import Loop, task_spec, torch_threads
from urm_ray.objectives import objective_for
from urm_ray.train.step import build_state, train_step
from urm_ray.train.session import Session, checkpoint_uri, datasets, prepare
from urm_ray.tune.space import load_space
from urm_ray.typed import to_dict

PHASES = ("prepare", "mlflow open", "datasets", "model build", "first batch", "training",
          "evaluation", "checkpoint", "mlflow close")
WORK = ("training", "evaluation")


class Phases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - start


def one_trial(cfg, number: int) -> dict[str, float]:
    t = Phases()
    with t("prepare"):
        cfg, meta = prepare(cfg)
    with t("mlflow open"):
        previous = tracking.find_summary(cfg.tracking.tracking_uri, cfg.tracking.experiment, cfg.train.run_name)
        session = Session.open(cfg, meta, previous, tags={"urm_ray.kind": "trial"}, params={"sampled.x": number})
    with t("datasets"):
        data = datasets(cfg, meta)
    folder = Path(cfg.checkpoint.storage_path) / cfg.train.run_name
    host = ProcessHost(data, folder, cfg.checkpoint.keep)
    with t("model build"):
        state = build_state(cfg, task_spec(cfg, meta), torch.device("cpu"), objective=objective_for(cfg, meta))
    loop = Loop(state, host, session.run.tracker(True), Sender(),
                InRun.for_run(cfg, meta))
    batches = TrainBatches(host.shard("train"), state.local_batch, state.position, cfg.data.shuffle_seed,
                           cfg.data.shuffle_buffer, state.device)
    with t("first batch"):
        batch = next(batches)
    with t("training"):
        for _ in range(cfg.train.steps):
            train_step(state, batch)
            batch = next(batches)
    with t("evaluation"):
        metrics = loop._evaluate()
    batches.close()
    with t("checkpoint"), tempfile.TemporaryDirectory() as tmp:
        checkpoint.save(Path(tmp), state.model, state.ema, state.optimizers, state.position, to_dict(cfg))
        host.report(metrics, Path(tmp), state.position.step)
    loop.tracker.close()
    with t("mlflow close"):
        session.run.finish(checkpoint_uri(host.latest()))
    return t.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--space", default="quickstart")
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--set", nargs="*", default=[], help="config overrides (dotted keys)")
    args = parser.parse_args()
    space = load_space(args.space, [])
    work = Path(tempfile.mkdtemp(prefix="trial-phases-"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    for number in range(args.trials):
        cfg = space.trial_config({}, {
            "train.run_name": f"t{number:03d}", "checkpoint.storage_path": str(work / "runs"),
            "train.steps": args.steps, "eval.every": args.steps, "train.log_every": args.steps,
            "checkpoint.every": args.steps, "tracking.tracking_uri": f"sqlite:///{work / 'mlflow.db'}",
            "tracking.experiment": "phases", **dict(kv.split("=", 1) for kv in args.set)})
        torch.set_num_threads(torch_threads(cfg.resources))
        rows.append(one_trial(cfg, number))
        print(f"trial {number}: " + ", ".join(f"{k} {v:.2f}" for k, v in rows[-1].items()), flush=True)
    later = rows[1:] or rows
    print(f"\nmedian over trials 1..{len(rows) - 1} (s):")
    for name in PHASES:
        print(f"  {name:<13} {statistics.median(r[name] for r in later):6.3f}")
    overhead = [sum(v for k, v in r.items() if k not in WORK) for r in later]
    print(f"  {'overhead':<13} {statistics.median(overhead):6.3f}  (all but {' + '.join(WORK)})")


if __name__ == "__main__":
    main()
