"""GRAM on a blank-board task with and without the prior match: valid and distinct prior samples.

    python bench/prior_match.py nqueens6 --steps 1000 --prior-match 0 1
    python bench/prior_match.py sudoku4-blank --steps 1500 --batch 64 --prior-match 1 --set model.hidden_size=64
    python bench/prior_match.py nqueens8 --prior-match 1 --set model.prior_match_targets=nearest
    python bench/prior_match.py nqueens8 --prior-match 0 --ema-decays 0.99 0.998 --temperatures 1 0.5

Every solution of the task (all 4 of 6x6 N-Queens, 92 of 8x8, 288 whole 4x4 Sudoku boards) is a
label of the same blank input. Each arm trains the task's preset model (``--set`` overrides it)
from the same seed with the training's own step (``train_step``: the verifier's Q-halt label,
the preset's optimizer, lr schedule, gradient clip, EMA and KL schedule) on one process without
Ray, and at every ``--eval-every`` steps draws ``--samples`` boards from the blank input with the
EMA and the raw weights (``generate_unconditional``; with ``model.max_segments`` > 1 also each
draw stopped by its halt head, ``ema_q`` / ``raw_q``), reporting the share the task's verifier
accepts and how many valid ones are distinct. ``--ema-decays`` keeps one average per decay
(training is the same: the average does not feed back), reported as ``ema`` (the preset's) or
``ema<decay>``; ``--temperatures`` scores the draws at each sampling temperature
(``model.sample_temperature``), keys suffixed ``@t`` where t is not 1; scoring draws from a
forked generator, so what is scored leaves training unchanged. With
``--set model.prior_match_targets=nearest`` the prior match trains towards the task's search
targets (the draws matched to all solutions), as the trainer does. Arms run one after another;
run two invocations side by side to use both cores.
"""

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from urm_ray.config import load_config
from urm_ray.data.tasks.nqueens import solutions
from urm_ray.data.tasks.sudoku import all_grids
from urm_ray.data.tasks.verify import nearest_for, verifier_for
from urm_ray.models.registry import TaskSpec
from urm_ray.optim import EMA
from urm_ray.objectives import GuidedObjective
from urm_ray.train.step import build_state, train_step
from urm_ray.eval.heldout import generate_unconditional

# task -> (preset, verifier's task, every solution as token boards [S, L], vocabulary size)
TASKS: dict[str, tuple[str, str, Any, int]] = {
    "nqueens6": ("nqueens6-gram", "nqueens", lambda: solutions(6), 3),
    "nqueens8": ("nqueens8-gram", "nqueens", lambda: solutions(8), 3),
    "sudoku4-blank": ("sudoku4-blank-gram", "sudoku", lambda: all_grids(4) + 1, 6),  # digit d -> token d + 1
}


def score(model: torch.nn.Module, verify: Any, samples: int, sample_halt: str = "limit",
          temperature: float = 1.0) -> dict[str, float]:
    """Share of ``samples`` blank-input draws the verifier accepts, and the distinct valid ones;
    each draw stops where ``sample_halt`` says (``model.sample_halt``), drawn at ``temperature``."""
    model.sample_halt, model.sample_temperature = sample_halt, temperature
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # training's random numbers stay as they were
        torch.manual_seed(1234)
        boards = generate_unconditional(model.eval(), num_samples=samples)
    valid = verify(boards, torch.ones_like(boards), boards).numpy()
    return {"valid": round(float(valid.mean()), 3), "distinct": len({b.tobytes() for b in boards.numpy()[valid]})}


def train_arm(task: str, weight: float, args: argparse.Namespace) -> dict[str, Any]:
    preset, verifier_task, boards_fn, vocab = TASKS[task]
    boards = torch.from_numpy(np.asarray(boards_fn())).long()
    # the arm without the match also drops the match's other fields, which would only warn
    off = ["model.prior_match_start=0", "model.prior_match_targets=label"] if weight == 0 else []
    cfg = load_config(preset, [*args.set, f"model.prior_match={weight}", *off, f"train.seed={args.seed}",
                               f"train.steps={args.steps}", f"train.global_batch_size={args.batch}"])
    verify = verifier_for(verifier_task, boards.shape[1])
    search = nearest_for(verifier_task, boards.shape[1], vocab) if cfg.model.prior_match_targets == "nearest" else None
    task = TaskSpec(vocab_size=vocab, seq_len=boards.shape[1], num_puzzle_identifiers=1)
    state = build_state(cfg, task, torch.device("cpu"), objective=GuidedObjective(cfg.train.loss, halt=verify, prior=search))
    model = state.model
    # the preset's decay is the training's own EMA; other decays are extra averages beside it
    emas = {"ema": state.ema} | {f"ema{d}": EMA(model, d) for d in args.ema_decays or []
                                 if d != cfg.optim.ema_decay}
    shadow = copy.deepcopy(model)
    curve, start = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        drawn = boards[torch.randint(0, len(boards), (args.batch,))]
        batch = {"inputs": torch.ones_like(drawn), "labels": drawn,
                 "puzzle_identifiers": torch.zeros(args.batch, dtype=torch.long)}
        metrics = train_step(state, batch)
        for name, ema in emas.items():
            if name != "ema":
                ema.update(model)
        if step % args.eval_every == 0 or step == args.steps:
            point = {"step": step, "seconds": round(time.perf_counter() - start),
                     "kl": round(float(metrics["kl"]) / args.batch, 2)}
            for name, ema in emas.items():
                ema.copy_to(shadow)
                point.update(scores(name, shadow, verify, cfg.model.max_segments, args))
            point.update(scores("raw", model, verify, cfg.model.max_segments, args))
            curve.append(point)
            print(json.dumps({"prior_match": weight, **point}), flush=True)
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        torch.save({name: ema.shadow for name, ema in emas.items()} | {"raw": model.state_dict()},
                   f"{args.save}.pm{weight:g}.pt")
    return {"prior_match": weight, "curve": curve}


def scores(name: str, model: torch.nn.Module, verify: Any, max_segments: int,
           args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """``model``'s scores at each temperature; with several segments also each draw stopped by its
    halt head (``<name>_q``)."""
    out = {}
    for t in args.temperatures:
        suffix = "" if t == 1 else f"@{t:g}"
        out[name + suffix] = score(model, verify, args.samples, "limit", t)
        if max_segments > 1:
            out[f"{name}_q{suffix}"] = score(model, verify, args.samples, "q", t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prior-match", type=float, nargs="+", default=[0.0, 1.0], help="one arm per weight")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ema-decays", type=float, nargs="+", default=[], help="default: the preset's")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0], help="sampling temperatures scored")
    parser.add_argument("--save", default="", help="path prefix: save each arm's averages and raw weights there")
    parser.add_argument("--set", nargs="*", default=[], help="config overrides, e.g. model.hidden_size=32")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = {"task": args.task, "steps": args.steps, "batch": args.batch, "set": args.set,
              "arms": [train_arm(args.task, weight, args) for weight in args.prior_match]}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
