"""Fixed cost of one `urm-ray train` run: where the seconds go between the command and its exit.

    python bench/run_overhead.py                                  # sudoku4-urm train.steps=50, 3 rounds
    python bench/run_overhead.py --rounds 5 --variant A= --variant B=RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=2
    python bench/run_overhead.py --variant in-process= --variant ray-train=+resources.in_process=false

Each round runs every variant once, in turn (interleaved), as a fresh process in a scratch
folder, and stamps each line the run prints with the time since the command started. The phases
are the spans between the run's own progress lines; each figure is the median over rounds. A
variant is ``NAME=ENV=VALUE,ENV=VALUE`` (``NAME=`` for the environment as it is); a ``+key=value``
among them is a config override added to that variant's command line.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

# (phase name, the log text that ends it), in the order a run prints them
MARKS = (
    ("imports", "reading data"),
    ("data check", "starting Ray"),
    ("ray.init + MLflow run", "starting 1 Ray Train worker"),
    ("controller + worker start", "building the model"),
    ("model build", "training from step"),
    ("training", "evaluating at step"),
    ("evaluation", "saving the checkpoint"),
    ("checkpoint", "stopping the workers"),
    ("worker teardown", "uploading the checkpoint"),
)


@dataclass(frozen=True)
class Variant:
    name: str
    env: dict[str, str]
    overrides: list[str]  # config overrides after the command's own


def _variant(text: str) -> Variant:
    name, _, settings = text.partition("=")
    pairs = [pair for pair in settings.split(",") if pair]
    bad = [pair for pair in pairs if "=" not in pair]
    if not name or bad:
        raise argparse.ArgumentTypeError(
            f"--variant {text!r}: expected NAME=ENV=VALUE,+key=value,... (or NAME= for the environment as it is)")
    env = dict(pair.split("=", 1) for pair in pairs if not pair.startswith("+"))
    return Variant(name, env, [pair[1:] for pair in pairs if pair.startswith("+")])


def _run(args: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run once; return each phase's seconds (the last one, "exit", up to the process's end)."""
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "urm_ray.cli", "train", *args, f"checkpoint.storage_path={scratch}/runs"],
            cwd=scratch, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        seen: dict[str, float] = {}
        assert proc.stdout is not None
        for line in proc.stdout:
            for _, text in MARKS:
                if text in line and text not in seen:
                    seen[text] = time.perf_counter() - start
        if proc.wait() != 0:
            raise SystemExit(f"the run failed (exit {proc.returncode}): urm-ray train {' '.join(args)}")
        total = time.perf_counter() - start
    phases, last = {}, 0.0
    for phase, text in MARKS:
        if text in seen:
            phases[phase], last = seen[text] - last, seen[text]
    phases["exit"] = total - last
    phases["total"] = total
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", default=["sudoku4-urm", "train.steps=50"],
                        help="what follows `urm-ray train`")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", action="append", type=_variant, default=[],
                        help="NAME=ENV=VALUE,+key=value,... (repeatable)")
    args = parser.parse_args()
    variants = args.variant or [Variant("as is", {}, [])]
    runs: dict[str, list[dict[str, float]]] = {v.name: [] for v in variants}
    for round_ in range(args.rounds):
        for variant in variants:
            phases = _run([*args.overrides, *variant.overrides], variant.env)
            runs[variant.name].append(phases)
            print(f"round {round_ + 1}/{args.rounds} {variant.name}: {phases['total']:.1f} s", flush=True)
    phase_names = [p for p, _ in MARKS] + ["exit", "total"]
    print(f"\nmedian seconds over {args.rounds} rounds: urm-ray train {' '.join(args.overrides)}")
    print(f"| phase | {' | '.join(runs)} |")
    print(f"|---|{'---|' * len(runs)}")
    for phase in phase_names:
        cells = [statistics.median(r.get(phase, 0.0) for r in rounds) for rounds in runs.values()]
        print(f"| {phase} | {' | '.join(f'{c:.1f}' for c in cells)} |")


if __name__ == "__main__":
    main()
