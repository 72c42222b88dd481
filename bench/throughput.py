"""Training throughput of one worker: samples/s, tokens/s, FLOPs per step and MFU, in-process.

    python bench/throughput.py sudoku4-urm --threads 2
    python bench/throughput.py sudoku4-urm model.hidden_size=512 model.loops=8 --vocab 11 \
        --seq-len 81 --steps 5 --json out.json

Each step is the trainer's own ``Trainer._step`` (one ACT segment, backward, optimizers, EMA) on
synthetic batches of the per-worker size, global_batch_size / num_workers; bf16 autocast on CUDA
as in training, fp32 on CPU. FLOPs per step are counted with FlopCounterMode over one real step
(so TBPTL's forward-only loops count once, not three times); MFU divides the achieved rate by a
measured square-matmul peak of the same dtype. Tokens are all positions the model runs on:
puzzle prefix + seq_len per row (the trainer's ``train/tokens_per_s`` excludes the prefix).
The task shape comes from --vocab/--seq-len/--puzzle-ids, else from the dataset's metadata.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from typing import Any

import torch
from torch.utils import flop_counter

from urm_ray.config import RunConfig, load_config
from urm_ray.data import builtin, stream
from urm_ray.data.config import DataConfig
from urm_ray.models.registry import TaskSpec, build_model
from urm_ray.optim import EMA, build_optimizers
from urm_ray.tracking import NullTracker
from urm_ray.train.loop import Trainer

# FlopCounterMode (torch 2.13) has formulas for the CUDA attention kernels only; SDPA on CPU
# dispatches to these ops, which would otherwise count as 0 FLOPs.
_aten = torch.ops.aten
CPU_ATTENTION = {
    _aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, **kw:
        flop_counter.sdpa_flop_count(q, k, v),
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda g, q, k, v, *a, **kw:
        flop_counter.sdpa_backward_flop_count(g, q, k, v),
}


def task_spec(cfg: DataConfig, args: argparse.Namespace) -> TaskSpec:
    """Flags win; whatever they leave out comes from the dataset's metadata."""
    if args.vocab and args.seq_len:
        return TaskSpec(args.vocab, args.seq_len, args.puzzle_ids or 1)
    meta = stream.load_meta(DataConfig(path=builtin.resolve_path(cfg.path)))
    return TaskSpec(args.vocab or meta.vocab_size, args.seq_len or meta.seq_len,
                    args.puzzle_ids or meta.num_puzzle_identifiers)


def matmul_peak(device: torch.device, dtype: torch.dtype, size: int, repeats: int = 5) -> float:
    """Best GFLOP/s of a [size, size] @ [size, size] torch.mm after one warm-up call."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    out = torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def analytic_flops(model: torch.nn.Module, cfg: RunConfig, rows: int, task: TaskSpec) -> float:
    """2 FLOPs per weight per token forward, 4 more backward; attention scores left out.

    URM: the stack runs M = loops passes forward, only the last M - N (truncation) backward.
    Other families are counted as one pass, i.e. the plain 6 * N * tokens of a transformer.
    """
    heads = ("embed_tokens", "puzzle_emb", "lm_head", "q_head")
    stack = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(heads))
    loops = getattr(cfg.model, "loops", 1)
    grad_loops = loops - getattr(cfg.model, "truncation", 0)
    positions = model.prefix_len + task.seq_len
    per_row = (2 * loops + 4 * grad_loops) * stack * positions
    return rows * (per_row + 6 * model.lm_head.weight.numel() * task.seq_len)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synthetic_batches(task: TaskSpec, rows: int, device: torch.device, count: int = 4) -> list[dict]:
    def one() -> dict[str, torch.Tensor]:
        tokens = torch.randint(0, task.vocab_size, (rows, task.seq_len), device=device)
        return {"inputs": tokens.int(), "labels": torch.randint_like(tokens, task.vocab_size),
                "puzzle_identifiers": torch.randint(0, task.num_puzzle_identifiers, (rows,),
                                                    device=device, dtype=torch.int32)}
    return [one() for _ in range(count)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = load_config(args.config, args.overrides)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads or cfg.train.torch_threads or
                          max(1, int(cfg.train.cpus_per_worker)))
    torch.manual_seed(cfg.train.seed)
    task = task_spec(cfg.data, args)
    model = build_model(cfg.model, task).to(device)
    ema = EMA(model, cfg.optim.ema_decay) if cfg.optim.ema else None
    # world = num_workers only sets the per-worker batch; there is no process group
    trainer = Trainer(cfg, model, model, ema, build_optimizers(model, cfg.optim), NullTracker(),
                      device, 0, cfg.train.num_workers, task.seq_len)
    rows = trainer.local_batch
    batches = synthetic_batches(task, rows, device)
    with flop_counter.FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        carry, _ = trainer._step(None, batches[0])  # the trainer's step, so the two cannot drift
    for i in range(args.warmup):
        carry, _ = trainer._step(carry, batches[i % len(batches)])
    seconds = []
    for i in range(args.steps):
        _sync(device)
        start = time.perf_counter()
        carry, _ = trainer._step(carry, batches[i % len(batches)])
        _sync(device)
        seconds.append(time.perf_counter() - start)
    bf16 = device.type == "cuda" and cfg.train.bf16
    peak = matmul_peak(device, torch.bfloat16 if bf16 else torch.float32,
                       args.peak_size or (8192 if device.type == "cuda" else 2048))
    mean, flops = statistics.mean(seconds), counter.get_total_flops()
    positions = model.prefix_len + task.seq_len
    return {
        "config": args.config, "overrides": args.overrides, "device": str(device),
        "dtype": "bf16" if bf16 else "fp32", "threads": torch.get_num_threads(),
        "task": {"vocab_size": task.vocab_size, "seq_len": task.seq_len, "prefix_len":
                 model.prefix_len, "num_puzzle_identifiers": task.num_puzzle_identifiers},
        "batch_per_worker": rows, "steps": args.steps,
        "parameters": sum(p.numel() for p in model.parameters()),
        "peak_gflops": peak,
        "flops_per_step": flops,
        "analytic_flops_per_step": analytic_flops(model, cfg, rows, task),
        "step_s_mean": mean, "step_s_p50": statistics.median(seconds),
        "samples_per_s": rows / mean, "tokens_per_s": rows * positions / mean,
        "achieved_gflops": flops / mean / 1e9, "mfu": flops / mean / 1e9 / peak,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def print_table(r: dict[str, Any]) -> None:
    t = r["task"]
    rows = [
        ("config", " ".join([r["config"], *r["overrides"]])),
        ("device / dtype / threads", f"{r['device']} / {r['dtype']} / {r['threads']}"),
        ("task (vocab, prefix + seq_len)", f"{t['vocab_size']}, {t['prefix_len']} + {t['seq_len']}"),
        ("batch per worker / timed steps", f"{r['batch_per_worker']} / {r['steps']}"),
        ("parameters", f"{r['parameters']:,}"),
        ("matmul peak", f"{r['peak_gflops']:.1f} GFLOP/s"),
        ("FLOPs / step (counted)", f"{r['flops_per_step'] / 1e9:.3f} GFLOP"),
        ("FLOPs / step (analytic)", f"{r['analytic_flops_per_step'] / 1e9:.3f} GFLOP"),
        ("step time mean / p50", f"{r['step_s_mean'] * 1e3:.1f} / {r['step_s_p50'] * 1e3:.1f} ms"),
        ("samples/s", f"{r['samples_per_s']:.1f}"),
        ("tokens/s (prefix + seq_len)", f"{r['tokens_per_s']:.0f}"),
        ("achieved", f"{r['achieved_gflops']:.2f} GFLOP/s"),
        ("MFU (vs measured peak)", f"{100 * r['mfu']:.1f} %"),
        ("peak RSS", f"{r['peak_rss_mib']:.0f} MiB"),
    ]
    for key, value in rows:
        print(f"{key:32s} {value}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="preset name or YAML path")
    parser.add_argument("overrides", nargs="*", help="dotted key=value config overrides")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after the counted one")
    parser.add_argument("--threads", type=int, default=0, help="0 = the config's torch threads")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--vocab", type=int, default=0, help="0 = from the dataset metadata")
    parser.add_argument("--seq-len", type=int, default=0, help="0 = from the dataset metadata")
    parser.add_argument("--puzzle-ids", type=int, default=0,
                        help="0 = from the metadata, or 1 when --vocab and --seq-len are given")
    parser.add_argument("--peak-size", type=int, default=0,
                        help="matmul side for the peak; 0 = 2048 on CPU, 8192 on CUDA")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_intermixed_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps={args.steps} must be >= 1 and --warmup={args.warmup} >= 0")
    result = run(args)
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
