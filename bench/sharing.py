"""Runs that share a machine: what two training processes at once get together, against one alone.

    python bench/sharing.py                                     # sudoku4-urm, 5 rounds of 20 s
    python bench/sharing.py --variant default= --variant passive=OMP_WAIT_POLICY=PASSIVE
    python bench/sharing.py --threads 2 --copies 2 --seconds 30

Each process builds the preset's training state and runs ``train_step`` on one random batch for
``--seconds``, then prints its samples/s. A round runs, per variant, one process alone and then
``--copies`` processes at once; variants take turns within each round (interleaved), and the
figure per variant is the median over rounds of (sum of the copies' samples/s) / (alone's). 1.0
means sharing costs nothing in total; 1/copies means the copies only wait on each other.
A variant is ``NAME=ENV=VALUE,ENV=VALUE`` (``NAME=`` for the environment as it is).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    from throughput import random_batch, task_spec
    from urm_ray.config import load_config
    from urm_ray.train.loop import torch_threads
    from urm_ray.train.step import build_state, train_step

    cfg = load_config(args.config, args.overrides)
    torch.set_num_threads(args.threads or torch_threads(cfg.resources))
    task = task_spec(cfg.data, argparse.Namespace(vocab=0, seq_len=0))
    state = build_state(cfg, task, torch.device("cpu"))
    batch = random_batch(state.local_batch, task, torch.device("cpu"))
    for _ in range(3):  # warm-up
        train_step(state, batch)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        train_step(state, batch)
        steps += 1
    print(json.dumps({"samples_per_s": steps * state.local_batch / (time.perf_counter() - start)}))


def run_copies(args: argparse.Namespace, env: dict[str, str], copies: int) -> list[float]:
    cmd = [sys.executable, __file__, "--child", "--seconds", str(args.seconds), "--threads",
           str(args.threads), args.config, *args.overrides]
    procs = [subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
             for _ in range(copies)]
    return [json.loads(p.communicate()[0].strip().splitlines()[-1])["samples_per_s"] for p in procs]


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, spec = text.partition("=")
    return name, dict(kv.split("=", 1) for kv in spec.split(",") if kv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default="sudoku4-urm")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=0, help="0 = the config's rule (torch_threads)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    variants = [parse_variant(v) for v in args.variant or ["default="]]
    ratios: dict[str, list[float]] = {name: [] for name, _ in variants}
    alone: dict[str, list[float]] = {name: [] for name, _ in variants}
    for r in range(args.rounds):
        for name, env in (variants if r % 2 == 0 else variants[::-1]):
            one = run_copies(args, env, 1)[0]
            together = run_copies(args, env, args.copies)
            alone[name].append(one)
            ratios[name].append(sum(together) / one)
            print(f"round {r} {name}: alone {one:.0f} samples/s, {args.copies} at once "
                  f"{' + '.join(f'{t:.0f}' for t in together)} = {sum(together) / one:.2f}x", flush=True)
    for name, _ in variants:
        print(f"{name}: alone median {statistics.median(alone[name]):.0f} samples/s; "
              f"{args.copies} at once together {statistics.median(ratios[name]):.2f}x of alone (median)")


if __name__ == "__main__":
    main()
