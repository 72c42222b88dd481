"""Training throughput, MFU and peak memory of the paper's URM on one GPU, one mode per process.

    python bench/gpu_throughput.py --mode compiled --precision bf16 --out results.jsonl   # step 4 of gpu_check.sh

The paper's URM (hidden 512, 4 layers, 8 heads, expansion 4, loops 8, truncation 2, a 512-wide
puzzle embedding: one prefix position) on its per-GPU shapes: ARC, 900 tokens at 96 rows (768 over
8 GPUs) with the ARC-AGI-1 puzzle table (1 + 800 tasks x 1001 augmentations), and Sudoku, 81 tokens
at 768 rows (the Sudoku-Extreme run's batch on one GPU). A shape's batch is halved until one
step fits; a compiled mode starts from the batch its eager twin fitted (read from the results).
Then one more warm-up step and --steps (3) timed ones: samples/s, peak ``max_memory_allocated``.

MFU = FLOPs per step (counted by ``FlopCounterMode`` over one eager step of 2 rows, times
rows / 2) per second, over the GPU's dense peak from its spec sheet for the mode's matmul precision
(bf16; fp32 steps use TF32 only where ``torch.backends.cuda.matmul.allow_tf32`` is on, PyTorch's
default is off) and over a measured 8192-square matmul of the same precision.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import time
from pathlib import Path

import torch
import torch._dynamo
from torch.utils.flop_counter import FlopCounterMode

from gpu_common import Results, device_for, free_device_memory, parser, random_batch, run_config, synchronize
from urm_ray.config import RunConfig
from urm_ray.models.task import TaskSpec
from urm_ray.train.step import TrainState, build_state, train_step

PAPER = {"model.name": "urm", "model.hidden_size": 512, "model.num_heads": 8, "model.num_layers": 4,
         "model.expansion": 4.0, "model.loops": 8, "model.truncation": 2, "model.max_segments": 16,
         "model.puzzle_emb_dim": 512}
TINY = {"model.name": "urm", "model.hidden_size": 32, "model.num_heads": 2, "model.num_layers": 1,
        "model.expansion": 1.0, "model.loops": 3, "model.truncation": 1, "model.puzzle_emb_dim": 32}
# shape: (task, the paper's rows per GPU), ARC first (the paper's GPU run, and where memory runs
# out); on --dry-run: below 128 tokens (the CPU's plain attention, which the FLOP counter counts)
# and a few rows
SHAPES = {"arc": (TaskSpec(12, 900, 1 + 800 * 1001), 96), "sudoku": (TaskSpec(11, 81, 1), 768)}
DRY_SHAPES = {"arc": (TaskSpec(12, 100, 5), 4), "sudoku": (TaskSpec(11, 81, 1), 8)}
# dense TFLOP/s from NVIDIA's spec sheets (sparsity doubles them): bf16, tf32, fp32 (no tensor cores)
SPEC = [(r"H200", (989.0, 494.7, 67.0)), (r"H100.*PCIe", (756.0, 378.0, 51.0)),
        (r"H100.*NVL", (835.0, 417.5, 60.0)), (r"H100", (989.0, 494.7, 67.0)),
        (r"A100", (312.0, 156.0, 19.5)), (r"\bL4\b", (121.0, 60.0, 30.3)), (r"A10G", (70.0, 35.0, 31.2))]


def matmul_precision(precision: str) -> str:
    """bf16, or for fp32 the precision CUDA's fp32 matmuls run in: tf32 or fp32."""
    if precision == "bf16":
        return "bf16"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def spec_tflops(name: str, precision: str) -> float | None:
    for pattern, peaks in SPEC:
        if re.search(pattern, name):
            return peaks[("bf16", "tf32", "fp32").index(precision)]
    return None


def matmul_tflops(device: torch.device, precision: str, repeats: int = 10) -> float:
    """Best TFLOP/s of a square matmul (8192 on a GPU, 256 on the CPU) on random operands."""
    size = 8192 if device.type == "cuda" else 256
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    out = torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e12


def config(base: dict, rows: int, compiled: bool, bf16: bool, states: bool = False) -> RunConfig:
    return run_config({**base, "train.global_batch_size": rows, "train.compile": compiled, "train.bf16": bf16,
                       "model.bf16_states": states})


def counted_flops(base: dict, task: TaskSpec, device: torch.device, rows: int, bf16: bool) -> float:
    """FLOPs of one step of ``rows`` rows: one eager step of 2 rows counted, scaled (FLOPs are
    per row; an ACT step runs one segment on every row)."""
    state = build_state(config(base, 2, False, bf16), task, device)
    with FlopCounterMode(display=False) as counter:
        train_step(state, random_batch(2, task, device))
    return counter.get_total_flops() * rows / 2


def fitted(base: dict, task: TaskSpec, device: torch.device, rows: int, compiled: bool, bf16: bool,
           states: bool) -> tuple[TrainState, dict, list[int], float]:
    """(state, batch, batches that ran out of memory, first step's seconds) at the largest of
    rows, rows / 2, ... whose first step fits."""
    too_big = []
    while rows >= 1:
        state = None
        torch._dynamo.reset()  # a fresh model's graphs would add up to dynamo's recompile limit
        try:
            state = build_state(config(base, rows, compiled, bf16, states), task, device)
            batch = random_batch(rows, task, device)
            start = time.perf_counter()
            train_step(state, batch)  # compiles, in a compiled mode
            synchronize(device)
            return state, batch, too_big, time.perf_counter() - start
        except torch.cuda.OutOfMemoryError:
            too_big.append(rows)
        state = batch = None  # outside the handler: its traceback holds the step's tensors
        gc.collect()
        free_device_memory()
        rows //= 2
    raise torch.cuda.OutOfMemoryError(f"not even one row fits: tried {too_big}")


def eager_batch(results: Path, shape: str, precision: str) -> int | None:
    """The batch the eager mode of ``precision`` fitted at ``shape``, from the results so far."""
    if not results.is_file():
        return None
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    fits = [r["rows"] for r in rows if r.get("check") == "throughput" and r.get("status") == "ok"
            and (r["shape"], r["mode"], r["precision"]) == (shape, "eager", precision)]
    return fits[-1] if fits else None


def measure(args: argparse.Namespace, device: torch.device, shape: str, peaks: dict) -> dict[str, object]:
    base = TINY if args.dry_run else PAPER
    task, rows = (DRY_SHAPES if args.dry_run else SHAPES)[shape]
    if args.mode == "compiled":
        rows = eager_batch(args.out, shape, args.precision) or rows
    bf16 = args.precision == "bf16"
    state, batch, too_big, first_s = fitted(base, task, device, rows, args.mode == "compiled", bf16,
                                            args.bf16_states)
    rows = state.local_batch
    train_step(state, batch)  # warm-up: the carry of a continuing segment
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        train_step(state, batch)
    synchronize(device)
    step_s = (time.perf_counter() - start) / args.steps
    peak, tokens = peak_gib(device), state.model.prefix_len + task.seq_len
    state = batch = None
    flops = counted_flops(base, task, device, rows, bf16)
    achieved = flops / step_s / 1e12
    return {"rows": rows, "out_of_memory_at": too_big, "tokens_per_row": tokens,
            "step_ms": round(1e3 * step_s, 2), "samples_per_s": round(rows / step_s, 1),
            "first_step_s": round(first_s, 1), "peak_mem_gib": peak,
            "tflops_per_step": round(flops / 1e12, 3), "achieved_tflops": round(achieved, 2),
            "mfu_spec": achieved / peaks["spec"] if peaks["spec"] else None,
            "mfu_matmul": achieved / peaks["matmul"]}


def peak_gib(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["eager", "compiled"], required=True)
    p.add_argument("--precision", choices=["fp32", "bf16"], required=True)
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    p.add_argument("--steps", type=int, default=3, help="timed steps per shape")
    p.add_argument("--bf16-states", action="store_true",
                   help="model.bf16_states=true: carried states and residual stream in bf16 (bf16 only)")
    args = p.parse_args()
    if args.bf16_states and args.precision != "bf16":
        p.error("--bf16-states needs --precision bf16: without autocast the option changes nothing")
    device = device_for(args)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    precision = matmul_precision(args.precision)
    peaks = {"spec": spec_tflops(name, precision), "matmul": matmul_tflops(device, precision)}
    Results(args.out, "matmul").write("ok", device=name, mode=args.mode, precision=precision,
                                      spec_tflops=peaks["spec"], measured_tflops=peaks["matmul"])
    results = Results(args.out, "throughput")
    for shape in args.shapes:
        shown = f"{args.precision} states" if args.bf16_states else args.precision
        fields = {"shape": shape, "mode": args.mode, "precision": shown, "matmul": precision}
        results.guarded(fields, lambda: measure(args, device, shape, peaks))


if __name__ == "__main__":
    main()
