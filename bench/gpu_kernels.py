"""What the training step runs on a GPU: flash attention, and host synchronisations.

    python bench/gpu_kernels.py flash --out results.jsonl   # steps 3 and 9 of bench/gpu_check.sh
    python bench/gpu_kernels.py sync --out results.jsonl

``flash``: one bf16 training step (forward and backward) of URM at tests/tiny.py's width and at
the paper's (hidden 512, 8 heads, head size 64), on 901-token rows (the ARC shape), inside
``sdpa_kernel(FLASH_ATTENTION)``: PyTorch raises there when flash attention cannot run. Recorded:
whether it ran, how many flash-attention calls the profiler saw, and which attention operators an
unforced step runs (the backend PyTorch picks by itself).

``sync``: each family's eager step under ``torch.cuda.set_sync_debug_mode("warn")``, after two
warm-up steps: every warning is a point where the step waits for the GPU (0 expected: the step
keeps its metrics on the device). On the CPU (--dry-run) the steps run without it.
"""

from __future__ import annotations

import argparse
import warnings
from collections import Counter
from contextlib import nullcontext

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from gpu_common import FAMILIES, TASK, Results, device_for, parser, random_batch, run_config, tiny_config
from urm_ray.config import RunConfig
from urm_ray.models.layers import PLAIN_ATTENTION_BELOW
from urm_ray.models.task import TaskSpec
from urm_ray.train.step import build_state, train_step

ARC = TaskSpec(vocab_size=12, seq_len=900, num_puzzle_identifiers=4)  # one 30x30 grid per row
# --dry-run: just long enough for the CPU's attention to call SDPA (PLAIN_ATTENTION_BELOW)
DRY = TaskSpec(vocab_size=12, seq_len=PLAIN_ATTENTION_BELOW, num_puzzle_identifiers=4)
PAPER = {"model.name": "urm", "model.hidden_size": 512, "model.num_heads": 8, "model.num_layers": 4,
         "model.expansion": 4.0, "model.loops": 8, "model.truncation": 2, "model.puzzle_emb_dim": 512,
         "model.halt_exploration_prob": 0.0, "train.global_batch_size": 2, "optim.warmup_steps": 0}


def attention_ops(cfg: RunConfig, task: TaskSpec, device: torch.device, forced: bool) -> Counter:
    """{attention operator: calls} in one profiled bf16 step of ``cfg``."""
    state = build_state(cfg, task, device)
    batch = random_batch(cfg.train.global_batch_size, task, device)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if forced else nullcontext(), \
            profile(activities=[ProfilerActivity.CPU]) as prof:
        train_step(state, batch)
    return Counter({e.key: e.count for e in prof.key_averages()
                    if "attention" in e.key and e.key.startswith("aten::")})


def flash_case(cfg: RunConfig, task: TaskSpec, device: torch.device) -> dict[str, object]:
    default = attention_ops(cfg, task, device, forced=False)
    forced = attention_ops(cfg, task, device, forced=True)
    calls = sum(count for op, count in forced.items() if "flash_attention" in op)
    return {"status": "ok" if calls else "FAIL", "flash_calls": calls, "forced_ops": dict(forced),
            "default_ops": dict(default)}


def flash(args: argparse.Namespace, device: torch.device, results: Results) -> None:
    tiny = tiny_config("urm", bf16=True, compile=False)
    paper = run_config({**PAPER, "train.bf16": True, "train.compile": False})
    task = DRY if args.dry_run else ARC
    for name, cfg in (("tiny", tiny), ("paper", paper)):
        if args.dry_run and name == "paper":
            continue  # a paper-size step takes minutes on a CPU
        results.guarded({"model": name, "hidden": cfg.model.hidden_size, "heads": cfg.model.num_heads,
                         "tokens": task.seq_len, "device": str(device)}, lambda: flash_case(cfg, task, device))


def sync_warnings(family: str, device: torch.device) -> dict[str, object]:
    state = build_state(tiny_config(family, compile=False), TASK, device)  # bf16 autocast on CUDA, as training
    batch = random_batch(state.local_batch, TASK, device)
    for _ in range(2):  # the first step builds the carry
        train_step(state, batch)
    if device.type != "cuda":
        return {"status": "skipped", "reason": "CPU: nothing to wait for"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(3):
                train_step(state, batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    where = Counter(f"{w.filename}:{w.lineno}: {str(w.message).splitlines()[0][:120]}" for w in caught)
    return {"status": "ok" if not caught else "FAIL", "warnings": len(caught), "steps": 3,
            "where": dict(where.most_common(10))}


def sync(args: argparse.Namespace, device: torch.device, results: Results) -> None:
    for family in args.families:
        results.guarded({"family": family, "device": str(device)}, lambda: sync_warnings(family, device))


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("what", choices=["flash", "sync"])
    p.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=list(FAMILIES))
    args = p.parse_args()
    device = device_for(args)
    check, run = {"flash": ("flash", flash), "sync": ("sync_debug", sync)}[args.what]
    run(args, device, Results(args.out, check))


if __name__ == "__main__":
    main()
