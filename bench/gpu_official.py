"""Our training step against the official URM step on one GPU, bf16 and compiled on both sides.

    python bench/gpu_official.py --out results.jsonl     # step 6 of bench/gpu_check.sh

The official side comes from the perf-vs-official harness (``--harness``; default: the first of
``shared/perf-vs-official`` in the repository, ``../shared/perf-vs-official`` and
``$PERF_VS_OFFICIAL``), run from where it lies, never copied: its ``build_official`` is the official
``pretrain.py`` step (forward_dtype bfloat16, its dwconv in bf16, ``torch.compile`` of the whole
model) on the official initialisation and batch that its ``prepare`` saves (into a temporary
``$PERF_CACHE``, removed at the end). Ours is ``build_state`` + ``train_step`` with ``train.bf16``
and ``train.compile`` on the same weights and batch, with the harness's optimizer settings at a
constant learning rate, as the official side runs. Without the harness, or without pydantic (which the official code
imports), the step writes one row, ``skipped``.

Each side's first step (compilation) is timed alone and written at once; then both are timed in
interleaved rounds as ``bench/vs_official.py`` does (each step ends by reading its loss, which
waits for the GPU), and the ratio is the median of per-round ratios after --skip rounds.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from gpu_common import Results, device_for, parser
from urm_ray.config import build_config
from urm_ray.models.official import config_from_official, load_official
from urm_ray.train.step import build_state, train_step
from urm_ray.typed import to_dict
from vs_official import interleave, load_harness, summarize

Step = Callable[[dict[str, torch.Tensor]], float]
PLACES = [Path("shared/perf-vs-official"), Path("../shared/perf-vs-official")]


def find_harness(given: Path | None) -> Path | None:
    places = [given] if given else [*PLACES, *(Path(p) for p in [os.environ.get("PERF_VS_OFFICIAL")] if p)]
    return next((p.resolve() for p in places if (p / "bench.py").is_file()), None)


def our_step(harness: ModuleType, name: str, blob: dict, device: torch.device) -> Step:
    arch = {k: v for k, v in harness.official_cfg(name).items() if k != "batch_size"}
    model_cfg, task = config_from_official("urm", arch)
    optim = harness.CONFIGS[name]["optim"]
    cfg = build_config({
        "model": to_dict(model_cfg),
        "optim": {"lr": optim["lr"], "weight_decay": optim["wd"], "puzzle_emb_lr": optim["pe_lr"],
                  "puzzle_emb_weight_decay": optim["pe_wd"], "ema_decay": optim["ema"], "warmup_steps": 0},
        "train": {"global_batch_size": harness.CONFIGS[name]["batch"], "bf16": True, "compile": True}})
    weights = load_official("urm", arch, blob["state_dict"]).state_dict()

    def placed(model: torch.nn.Module) -> torch.nn.Module:  # the official weights, before compiling
        model.load_state_dict(weights)
        return model.to(device)

    state = build_state(cfg, task, device, wrap=placed)
    return lambda rows: float(train_step(state, rows)["lm_loss"])


def official_step(harness: ModuleType, name: str, blob: dict, device: torch.device) -> Step:
    sys.path.insert(0, str(harness.HERE / "official"))
    import models.layers as layers  # the harness's copy of the official code

    layers._DWCONV_DTYPE = torch.bfloat16  # as shipped
    with torch.device(device):  # as official pretrain.py builds the model
        _, step = harness.build_official(name, blob, None, compile=True, dtype="bfloat16")
    carry_made = False

    def run(rows: dict[str, torch.Tensor]) -> float:
        nonlocal carry_made
        if not carry_made:  # the first step makes the carry: on the device, as pretrain.py does
            carry_made = True
            with torch.device(device):
                return step(rows)["lm_loss"]
        return step(rows)["lm_loss"]

    return run


def compare(args: argparse.Namespace, device: torch.device, harness_path: Path, results: Results) -> None:
    harness = load_harness(harness_path)
    harness.prepare(args.config)
    blob = torch.load(harness.CACHE / f"{args.config}.pt")
    batch = {k: v.to(device) for k, v in blob["batch"].items()}
    fields = {"config": args.config, "rows": harness.CONFIGS[args.config]["batch"], "device": str(device)}
    steps: dict[str, Step] = {}
    for side, build in (("oursbf16c", our_step), ("officialbf16c", official_step)):
        make = functools.partial(build, harness, args.config, blob, device)
        results.guarded({**fields, "side": side, "phase": "first step"},
                        functools.partial(first_step, steps, side, make, batch))
    if len(steps) == 2:
        results.guarded({**fields, "phase": "rounds", "rounds": args.rounds, "skip": args.skip},
                        lambda: timed(steps, batch, args, harness.CONFIGS[args.config]["batch"]))


def first_step(steps: dict[str, Step], side: str, build: Callable[[], Step], batch: dict) -> dict[str, object]:
    """Build ``side`` into ``steps`` and time its first step (compilation)."""
    steps[side] = build()
    start = time.perf_counter()
    loss = steps[side](batch)
    return {"first_step_s": round(time.perf_counter() - start, 1), "lm_loss": loss}


def timed(steps: dict[str, Step], batch: dict, args: argparse.Namespace, rows: int) -> dict[str, object]:
    seconds, first_loss = interleave(steps, batch, args.rounds)
    summary = summarize(seconds, rows, args.skip)
    return {"samples_per_s": summary["samples_per_s"], "ratio": summary["ratios"].get("oursbf16c/officialbf16c"),
            "lm_loss": first_loss}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--harness", type=Path, help="the perf-vs-official folder")
    p.add_argument("--config", choices=["a", "b", "c"], help="the harness's config (default c; b on --dry-run)")
    p.add_argument("--rounds", type=int, default=8, help="interleaved rounds (2 on --dry-run)")
    p.add_argument("--skip", type=int, default=2, help="first rounds left out (recompilation; 1 on --dry-run)")
    args = p.parse_args()
    args.config = args.config or ("b" if args.dry_run else "c")
    if args.dry_run:
        args.rounds, args.skip = 2, 1
    device = device_for(args)
    results = Results(args.out, "vs_official")
    harness = find_harness(args.harness)
    if harness is None:
        results.write("skipped", reason="harness not present", looked_in=[str(p) for p in PLACES])
        return
    if importlib.util.find_spec("pydantic") is None:  # the official model's config class
        results.write("skipped", reason="the official code needs pydantic, which is not installed",
                      harness=str(harness))
        return
    with tempfile.TemporaryDirectory(prefix="perf-cache-") as cache:
        os.environ["PERF_CACHE"] = cache  # where the harness's prepare saves; read when it is imported
        compare(args, device, harness, results)


if __name__ == "__main__":
    main()
