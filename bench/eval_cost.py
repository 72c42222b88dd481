"""Wall time of `urm-ray eval CHECKPOINT` as a fresh process, from the command to its exit.

    python bench/eval_cost.py                                       # 3 rounds, this checkout
    python bench/eval_cost.py --rounds 5 --variant new= --variant old=PYTHONPATH=/path/to/other/checkout

A 20-step `sudoku4-urm` checkpoint is trained once (on the built-in 4x4 Sudoku data, 500 held-out
puzzles), then each round evaluates it once per variant, in turn (interleaved). A variant is
``NAME=ENV=VALUE,ENV=VALUE`` (``NAME=``: the environment as it is); ``PYTHONPATH`` pointing at
another checkout compares two versions of the code on the same checkpoint. Prints each variant's
median seconds, its ratio to the first variant's, and whether every variant reported the same
metrics.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, settings = text.partition("=")
    pairs = [pair for pair in settings.split(",") if pair]
    if not name or any("=" not in pair for pair in pairs):
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME=ENV=VALUE,... (or NAME=)")
    return name, dict(pair.split("=", 1) for pair in pairs)


def _cli(args: list[str], env: dict[str, str], cwd: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "urm_ray.cli", *args], cwd=cwd, env={**os.environ, **env},
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"urm-ray {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", type=_variant, action="append", default=[])
    args = parser.parse_args()
    variants = args.variant or [("this checkout", {})]
    with tempfile.TemporaryDirectory(prefix="eval_cost-") as scratch:
        _, out = _cli(["train", "sudoku4-urm", "train.steps=20", f"tracking.tracking_uri=sqlite:///{scratch}/mlflow.db",
                       f"checkpoint.storage_path={scratch}/runs", "train.run_name=eval-cost"], {}, scratch)
        checkpoint = json.loads(out)["checkpoint"]
        seconds: dict[str, list[float]] = {name: [] for name, _ in variants}
        reports: dict[str, dict] = {}
        for round_ in range(args.rounds):
            for name, env in variants:
                took, out = _cli(["eval", checkpoint], env, scratch)
                seconds[name].append(took)
                reports[name] = {k: v for k, v in json.loads(out).items() if not k.startswith("time")}
            print(f"round {round_ + 1}/{args.rounds}: "
                  + ", ".join(f"{name} {seconds[name][-1]:.2f} s" for name, _ in variants), flush=True)
    first = statistics.median(seconds[variants[0][0]])
    for name, _ in variants:
        median = statistics.median(seconds[name])
        print(f"{name:<20} median {median:6.2f} s   / {variants[0][0]}: {median / first:.2f}")
    print("same metrics:", len({json.dumps(r, sort_keys=True) for r in reports.values()}) == 1)


if __name__ == "__main__":
    main()
