"""Our training step against the official URM step, like for like, in one process.

    python bench/vs_official.py c --rounds 8 --out c.json
    python bench/vs_official.py a --sides ours,official32 --harness ../shared/perf-vs-official

The official side comes from the perf-vs-official harness (``--harness``, default
``../shared/perf-vs-official``, or ``$PERF_VS_OFFICIAL``): its ``bench.py`` builds the official
URM model, loss head, optimizers and EMA with the step of the official ``pretrain.py``, from the
official initialisation and batch it saved (``python bench.py prepare CFG`` there, once). Our side
is ``build_state`` + ``train_step`` (what every run trains with) on the same weights and batch.
Each round runs one step of every side, in alternating order; figures are medians over the
rounds after ``--skip`` (compiled sides compile in the first ones), and each ratio is the median
of per-round ratios, so the machine's load hits both sides of a ratio alike. ``peak_rss_mib`` is
the process's: run one side per process to compare memory (``--sides ours``, ``--sides official32``).

Sides (fp32 unless named):
    ours          eager                     official      eager, its dwconv in bf16 (as shipped)
    oursc         train.compile             official32    eager, its dwconv in fp32
    oursbf16      train.bf16 (autocast)     official32c   compiled, dwconv in fp32
    oursbf16c     train.bf16 + compile      officialbf16  forward_dtype bf16, eager
                                            officialbf16c forward_dtype bf16, compiled
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from urm_ray.config import load_config
from urm_ray.models.official import config_from_official, load_official
from urm_ray.train.step import build_state, train_step

Step = Callable[[dict[str, torch.Tensor]], float]
OURS = {"ours": (), "oursc": ("train.compile=true",), "oursbf16": ("train.bf16=true",),
        "oursbf16c": ("train.bf16=true", "train.compile=true")}
# side: (its dwconv dtype, forward dtype, compiled)
OFFICIAL = {"official": (torch.bfloat16, "float32", False),
            "official32": (torch.float32, "float32", False),
            "official32c": (torch.float32, "float32", True),
            "officialbf16": (torch.bfloat16, "bfloat16", False),
            "officialbf16c": (torch.bfloat16, "bfloat16", True)}
PAIRS = [("ours", "official32"), ("ours", "official"), ("oursc", "official32c"),
         ("oursbf16", "officialbf16"), ("oursbf16c", "officialbf16c"), ("oursbf16c", "official32c")]


def load_harness(path: Path) -> ModuleType:
    if not (path / "bench.py").is_file():
        raise SystemExit(f"no perf-vs-official harness at {path} (bench.py missing): pass --harness")
    sys.path.insert(0, str(path))
    import bench as harness  # the harness's own module

    return harness


def our_step(harness: ModuleType, name: str, blob: dict, extra: tuple[str, ...]) -> Step:
    """``train_step`` on our model holding the official weights, with the harness's optimizer
    settings (the harness's ``sudoku4-urm`` base; only the sizes come from the official config)."""
    arch = {k: v for k, v in harness.official_cfg(name).items() if k != "batch_size"}
    model_cfg, task = config_from_official("urm", arch)
    optim, batch = harness.CONFIGS[name]["optim"], harness.CONFIGS[name]["batch"]
    cfg = load_config("sudoku4-urm", [
        f"train.global_batch_size={batch}", "resources.num_workers=1", f"optim.lr={optim['lr']}",
        f"optim.weight_decay={optim['wd']}", f"optim.ema_decay={optim['ema']}", *extra])
    cfg = dataclasses.replace(cfg, model=model_cfg,
                              optim=dataclasses.replace(cfg.optim, puzzle_emb_lr=optim["pe_lr"],
                                                        puzzle_emb_weight_decay=optim["pe_wd"]))
    official = load_official("urm", arch, blob["state_dict"])
    state = build_state(cfg, task, torch.device("cpu"))
    state.model.load_state_dict(official.state_dict())  # the EMA's start does not change the step
    return lambda rows: float(train_step(state, rows)["lm_loss"])


def official_step(harness: ModuleType, name: str, blob: dict, side: str) -> Step:
    sys.path.insert(0, str(harness.HERE / "official"))
    import models.layers as layers  # the harness's copy of the official code

    dwconv, dtype, compiled = OFFICIAL[side]
    layers._DWCONV_DTYPE = dwconv  # read when the official ConvSwiGLU is built
    _, step = harness.build_official(name, blob, None, compile=compiled, dtype=dtype)
    return lambda rows: float(step(rows)["lm_loss"])


def interleave(steps: dict[str, Step], batch: dict, rounds: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Every step's seconds per side, and each side's first loss (like for like: equal in fp32)."""
    seconds: dict[str, list[float]] = {side: [] for side in steps}
    first_loss: dict[str, float] = {}
    order = list(steps)
    for r in range(rounds):
        for side in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            loss = steps[side](batch)
            seconds[side].append(time.perf_counter() - start)
            first_loss.setdefault(side, loss)
        print(f"round {r}: " + " ".join(f"{s} {seconds[s][-1]:.3f}s" for s in order), flush=True)
    return seconds, first_loss


def summarize(seconds: dict[str, list[float]], rows: int, skip: int) -> dict:
    kept = {side: times[skip:] for side, times in seconds.items()}
    summary = {"samples_per_s": {s: rows / statistics.median(t) for s, t in kept.items()}, "ratios": {}}
    for ours, theirs in PAIRS:
        if ours in kept and theirs in kept:
            per_round = [t / o for o, t in zip(kept[ours], kept[theirs])]
            summary["ratios"][f"{ours}/{theirs}"] = {
                "median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="a harness config: a, b or c")
    p.add_argument("--sides", default="ours,official32,oursc,official32c")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--skip", type=int, default=3, help="first rounds left out (compilation)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--harness", type=Path,
                   default=Path(os.environ.get("PERF_VS_OFFICIAL", "../shared/perf-vs-official")))
    p.add_argument("--out", type=Path, help="write every step's time and the summary as JSON")
    args = p.parse_args()
    sides = args.sides.split(",")
    unknown = [s for s in sides if s not in OURS and s not in OFFICIAL]
    if unknown:
        raise SystemExit(f"unknown side(s) {unknown}; known: {sorted({**OURS, **OFFICIAL})}")
    if args.rounds <= args.skip:
        raise SystemExit(f"--rounds {args.rounds} must exceed --skip {args.skip}")
    harness = load_harness(args.harness.resolve())
    blob_path = harness.CACHE / f"{args.config}.pt"
    if not blob_path.is_file():
        raise SystemExit(f"{blob_path} missing: run `python bench.py prepare {args.config}` in {args.harness}")
    torch.set_num_threads(args.threads)
    blob = torch.load(blob_path)
    steps = {side: our_step(harness, args.config, blob, OURS[side]) if side in OURS
             else official_step(harness, args.config, blob, side) for side in sides}
    seconds, first_loss = interleave(steps, blob["batch"], args.rounds)
    summary = {**summarize(seconds, harness.CONFIGS[args.config]["batch"], args.skip),
               "first_lm_loss": first_loss,
               "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"config": args.config, "threads": args.threads,
                                        "seconds": seconds, **summary}, indent=1))


if __name__ == "__main__":
    main()
