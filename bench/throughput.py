"""Training throughput of one worker, in-process: samples/s, tokens/s, FLOPs per step and MFU.

    python bench/throughput.py sudoku4-urm model.loops=8 --vocab 11 --seq-len 81 --json out.json

A step is the trainer's own ``Trainer._step`` (ACT segment, backward, optimizers, EMA) on a random
batch of global_batch_size / num_workers rows; bf16 autocast on CUDA as in training, else fp32.
FLOPs are counted over one real step (TBPTL's no-grad loops count forward only); MFU = achieved /
same-dtype matmul peak. Tokens/row = prefix + seq_len (the trainer's tokens_per_s omits prefixes).
"""

import argparse
import json
import resource
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.utils import flop_counter

from urm_ray.config import RunConfig, load_config
from urm_ray.data import builtin, stream
from urm_ray.data.config import DataConfig
from urm_ray.models.registry import TaskSpec, build_model
from urm_ray.optim import EMA, build_optimizers
from urm_ray.tracking import NullTracker
from urm_ray.train.loop import Trainer, _threads

# FlopCounterMode (torch 2.13) counts 0 for CPU SDPA, and `channels` times too much for URM's
# depthwise conv backward (grad weight ignores groups, pytorch PR 183405): each half = 1 forward.
aten = torch.ops.aten
FLOP_FIXES = {
    aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, **kw:
        flop_counter.sdpa_flop_count(q, k, v),
    aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda g, q, k, v, *a, **kw:
        flop_counter.sdpa_backward_flop_count(g, q, k, v),
    aten.convolution_backward: lambda g, x, w, *a, **kw:  # a[4] transposed, a[7] output_mask
        flop_counter.conv_flop_count(x, w, g, a[4]) * (bool(a[7][0]) + bool(a[7][1])),
}


def task_spec(cfg: DataConfig, args: argparse.Namespace) -> TaskSpec:
    """data.path's metadata, --vocab/--seq-len overriding; both given: one puzzle id, no dataset."""
    if args.vocab and args.seq_len:
        return TaskSpec(args.vocab, args.seq_len, 1)
    meta = stream.load_meta(DataConfig(path=builtin.resolve_path(cfg.path)))
    return TaskSpec(args.vocab or meta.vocab_size, args.seq_len or meta.seq_len,
                    stream.puzzle_table_size(meta, cfg))


def timed(fn: partial[Any], device: torch.device) -> tuple[float, Any]:
    """(wall seconds, result) of fn(), including the wait for its queued device work."""
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # kernels run asynchronously
    return time.perf_counter() - start, out


def matmul_peak(device: torch.device, bf16: bool, repeats: int = 5) -> float:
    """Best GFLOP/s of a square torch.mm (bf16 8192 or fp32 2048 wide), after a warm-up call."""
    size, dtype = (8192, torch.bfloat16) if bf16 else (2048, torch.float32)
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    out = torch.mm(a, b)  # warm-up; the first timing also waits for it, and min() drops that
    best = min(timed(partial(torch.mm, a, b, out=out), device)[0] for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def analytic_flops(model: Any, cfg: RunConfig, rows: int, task: TaskSpec) -> float:
    """2 FLOPs per weight and token forward, 4 backward, attention scores left out: URM's stack
    runs `loops` passes forward, `loops - truncation` backward; other families count one pass."""
    heads = ("embed_tokens", "puzzle_emb", "lm_head", "q_head")  # not in the looped stack
    stack = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(heads))
    loops, truncation = getattr(cfg.model, "loops", 1), getattr(cfg.model, "truncation", 0)
    per_row = (2 * loops + 4 * (loops - truncation)) * stack * (model.prefix_len + task.seq_len)
    return rows * (per_row + 6 * model.lm_head.weight.numel() * task.seq_len)


def measure(trainer: Trainer, task: TaskSpec, warmup: int,
            steps: int) -> tuple[int, list[float], float]:
    """FLOPs of one counted step (the trainer's own: no drift), step seconds, CPU share."""
    rows, rand = trainer.local_batch, partial(torch.randint, device=trainer.device)
    batch = {"inputs": rand(task.vocab_size, (rows, task.seq_len)).int(),  # int32 [B, L]
             "labels": rand(task.vocab_size, (rows, task.seq_len)),  # int64 [B, L]
             "puzzle_identifiers": rand(task.num_puzzle_identifiers, (rows,)).int()}  # int32 [B]
    with flop_counter.FlopCounterMode(display=False, custom_mapping=FLOP_FIXES) as counter:
        carry, _ = trainer._step(None, batch)
    seconds, cpu = [], time.process_time()
    for _ in range(warmup + steps):  # the cost does not depend on the token values
        step_s, (carry, _) = timed(partial(trainer._step, carry, batch), trainer.device)
        seconds.append(step_s)
    cpu_share = (time.process_time() - cpu) / sum(seconds) / torch.get_num_threads()  # <1: busy
    return counter.get_total_flops(), seconds[warmup:], cpu_share


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg, device = load_config(args.config, args.overrides), torch.device(args.device)
    torch.set_num_threads(args.threads or _threads(cfg))  # the trainer's rule when --threads is 0
    torch.manual_seed(cfg.train.seed)
    task = task_spec(cfg.data, args)
    model = build_model(cfg.model, task).to(device)
    ema = EMA(model, cfg.optim.ema_decay) if cfg.optim.ema else None
    trainer = Trainer(cfg, model, model, ema, build_optimizers(model, cfg.optim), NullTracker(),
                      device, 0, cfg.train.num_workers, task.seq_len)  # world: batch size only
    rows, bf16 = trainer.local_batch, device.type == "cuda" and cfg.train.bf16
    peak_before = matmul_peak(device, bf16)
    flops, seconds, cpu_share = measure(trainer, task, args.warmup, args.steps)
    peak = max(peak_before, matmul_peak(device, bf16))  # other processes' load varies over time
    mean, tokens_per_row = statistics.mean(seconds), model.prefix_len + task.seq_len
    return {
        "config": " ".join([args.config, *args.overrides]), "device": str(device),
        "dtype": "bf16" if bf16 else "fp32", "threads": torch.get_num_threads(),
        "vocab_size": task.vocab_size, "seq_len": task.seq_len, "tokens_per_row": tokens_per_row,
        "batch_per_worker": rows, "timed_steps": args.steps, "peak_gflops": peak,
        "parameters": sum(p.numel() for p in model.parameters()), "flops_per_step": flops,
        "analytic_flops_per_step": analytic_flops(model, cfg, rows, task),
        "step_s_mean": mean, "step_s_p50": statistics.median(seconds), "cpu_share": cpu_share,
        "samples_per_s": rows / mean, "tokens_per_s": rows * tokens_per_row / mean,
        "achieved_gflops": flops / mean / 1e9, "mfu": flops / mean / 1e9 / peak,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="preset name or YAML path")
    parser.add_argument("overrides", nargs="*", help="dotted key=value config overrides")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after the counted one")
    parser.add_argument("--threads", type=int, default=0, help="0 = the config's torch threads")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--vocab", type=int, default=0, help="0 = from the dataset metadata")
    parser.add_argument("--seq-len", type=int, default=0, help="0 = from the dataset metadata")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_intermixed_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps={args.steps} must be >= 1 and --warmup={args.warmup} >= 0")
    result = run(args)
    for key, value in result.items():  # the key names carry the units
        print(f"{key:24s}", format(value, {float: ",.4g", int: ","}.get(type(value), "")))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
