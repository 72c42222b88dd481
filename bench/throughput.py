"""Training throughput of one worker, in-process, eager and compiled side by side.

    python bench/throughput.py --preset a --threads 2              # the reference configs a, b, c
    python bench/throughput.py sudoku4-urm model.loops=8 --vocab 11 --seq-len 81 --json out.json
    python bench/throughput.py --preset c --modes eager            # one side only
    python bench/throughput.py --preset c --precisions fp32 bf16   # fp32 and bf16 autocast too

A step is the training's own ``train_step`` (ACT segment, backward, optimizers, EMA) on a random
batch of global_batch_size / num_workers rows, in the precision training would use (bf16
autocast on CUDA, fp32 on CPU, unless train.bf16 says otherwise) or in each of --precisions.
Every side (eager or compiled, ``train.compile=true``, per precision) starts from the same
weights, and the sides are timed in interleaved rounds, so the machine's load hits them alike;
each figure is the median over rounds. With one precision the sides are named ``eager`` and
``compiled``; with two, ``eager_fp32``, ``eager_bf16``, ``compiled_fp32``, ``compiled_bf16``.
The compiled side's first steps (compilation) are reported as ``warmup_s``, not timed.
FLOPs are counted over one real eager step (TBPTL's no-grad loops count forward only); MFU =
achieved / the same dtype's matmul peak. Tokens/row = prefix + seq_len. Peak memory: CUDA's peak
allocation per side; on CPU the process's peak RSS (both sides share the process).
"""

import argparse
import dataclasses
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
from urm_ray.models.registry import TaskSpec
from urm_ray.train.loop import torch_threads
from urm_ray.train.step import bf16_enabled, build_state, train_step

# FlopCounterMode (torch 2.13) counts 0 for CPU SDPA: each is one attention forward / backward.
aten = torch.ops.aten
FLOP_FIXES = {
    aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, **kw:
        flop_counter.sdpa_flop_count(q, k, v),
    aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda g, q, k, v, *a, **kw:
        flop_counter.sdpa_backward_flop_count(g, q, k, v),
}
# Reference configs, also timed with the official URM code: 9x9 Sudoku shape
# (81 tokens + a 1-position puzzle prefix), official H_cycles x L_cycles = loops, (H-1) x L = truncation.
PRESETS = {
    "a": ["sudoku4-urm", "model.hidden_size=128", "model.num_heads=8", "model.num_layers=2",
          "model.expansion=4", "model.loops=8", "model.truncation=4", "model.puzzle_emb_dim=128",
          "train.global_batch_size=64", "--vocab", "11", "--seq-len", "81"],
    "b": ["sudoku4-urm", "model.truncation=2", "train.global_batch_size=128"],
    "c": ["sudoku4-urm", "model.hidden_size=512", "model.num_heads=8", "model.num_layers=4",
          "model.expansion=4", "model.loops=8", "model.truncation=4", "model.puzzle_emb_dim=512",
          "train.global_batch_size=8", "--vocab", "11", "--seq-len", "81"],
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
    """Best GFLOP/s of a square torch.mm (bf16 8192 wide on GPU, 4096 on CPU; fp32 2048), after a
    warm-up call."""
    size = (8192 if device.type == "cuda" else 4096) if bf16 else 2048
    dtype = torch.bfloat16 if bf16 else torch.float32
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


def random_batch(rows: int, task: TaskSpec, device: torch.device) -> dict[str, torch.Tensor]:
    """A batch in the stream's dtypes; the step's cost does not depend on the token values."""
    rand = partial(torch.randint, device=device)
    return {"inputs": rand(task.vocab_size, (rows, task.seq_len)).int(),  # int32 [B, L]
            "labels": rand(task.vocab_size, (rows, task.seq_len)),  # int64 [B, L]
            "puzzle_identifiers": rand(task.num_puzzle_identifiers, (rows,)).int()}  # int32 [B]


class Side:
    """One training state (eager or compiled), stepped in timed rounds."""

    def __init__(self, cfg: RunConfig, task: TaskSpec, device: torch.device, compiled: bool,
                 bf16: bool) -> None:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, compile=compiled, bf16=bf16))
        self.bf16 = bf16
        # every side starts from the same weights (seeded by train.seed)
        self.state = build_state(cfg, task, device, world=cfg.resources.num_workers)
        self.batch = random_batch(self.state.local_batch, task, device)
        self.samples_per_s, self.peak_mem_mib = [], 0.0

    def steps(self, count: int) -> float:
        """Run ``count`` steps; seconds they took."""
        device = self.state.device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        for _ in range(count):
            train_step(self.state, self.batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            self.peak_mem_mib = max(self.peak_mem_mib, torch.cuda.max_memory_allocated(device) / 2**20)
        return time.perf_counter() - start


def counted_flops(side: Side) -> int:
    """FLOPs of one eager step, counted (the trainer's own step: no drift from the real one)."""
    with flop_counter.FlopCounterMode(display=False, custom_mapping=FLOP_FIXES) as counter:
        train_step(side.state, side.batch)
    return counter.get_total_flops()


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg, device = load_config(args.config, args.overrides), torch.device(args.device)
    torch.set_num_threads(args.threads or torch_threads(cfg.resources))  # the trainer's rule when --threads is 0
    task = task_spec(cfg.data, args)
    precisions = args.precisions or [default_precision(cfg, device)]
    sides = {side_name(mode, precision, len(precisions)): Side(cfg, task, device, mode == "compiled",
                                                               precision == "bf16")
             for mode in args.modes for precision in precisions}
    first = next(iter(sides.values()))
    rows = first.state.local_batch
    peak_before = {p: matmul_peak(device, p == "bf16") for p in precisions}
    eager = [side for name, side in sides.items() if name.startswith("eager")]
    flops = counted_flops(eager[0]) if eager else 0  # a compiled step is not counted
    warmup = {mode: side.steps(args.warmup) for mode, side in sides.items()}  # compiles here
    cpu = time.process_time()
    busy = 0.0
    for _ in range(args.rounds):
        for side in sides.values():
            seconds = side.steps(args.steps)
            busy += seconds
            side.samples_per_s.append(rows * args.steps / seconds)
    cpu_share = (time.process_time() - cpu) / busy / torch.get_num_threads()  # <1: machine busy
    # other processes' load varies over time
    peak = {p: max(peak_before[p], matmul_peak(device, p == "bf16")) for p in precisions}
    model, tokens_per_row = first.state.model, first.state.model.prefix_len + task.seq_len
    result: dict[str, Any] = {
        "config": " ".join([args.config, *args.overrides]), "device": str(device),
        "dtype": " ".join(precisions), "threads": torch.get_num_threads(),
        "vocab_size": task.vocab_size, "seq_len": task.seq_len, "tokens_per_row": tokens_per_row,
        "batch_per_worker": rows, "rounds": args.rounds, "steps_per_round": args.steps,
        **{f"peak_gflops{'' if len(precisions) == 1 else '_' + p}": g for p, g in peak.items()},
        "parameters": sum(p.numel() for p in model.parameters()),
        "flops_per_step": flops, "analytic_flops_per_step": analytic_flops(model, cfg, rows, task),
        "cpu_share": cpu_share,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
    }
    for mode, side in sides.items():
        rate = statistics.median(side.samples_per_s)
        result[f"{mode}_samples_per_s"] = rate
        result[f"{mode}_tokens_per_s"] = rate * tokens_per_row
        result[f"{mode}_warmup_s"] = warmup[mode]
        if flops:
            result[f"{mode}_mfu"] = flops * rate / rows / 1e9 / peak["bf16" if side.bf16 else "fp32"]
        if device.type == "cuda":
            result[f"{mode}_peak_mem_mib"] = side.peak_mem_mib
    for precision in precisions:  # interleaved, so the ratio of each round's pair is the figure
        eager, compiled = (side_name(m, precision, len(precisions)) for m in ("eager", "compiled"))
        if eager in sides and compiled in sides:
            suffix = "" if len(precisions) == 1 else f"_{precision}"
            result[f"compiled_over_eager{suffix}"] = median_ratio(sides[compiled], sides[eager])
    if len(precisions) == 2:
        for mode in args.modes:
            result[f"bf16_over_fp32_{mode}"] = median_ratio(sides[f"{mode}_bf16"], sides[f"{mode}_fp32"])
    return result


def default_precision(cfg: RunConfig, device: torch.device) -> str:
    """The precision training would use (``bf16_enabled``)."""
    return "bf16" if bf16_enabled(device, cfg.train.bf16) else "fp32"


def side_name(mode: str, precision: str, precisions: int) -> str:
    return mode if precisions == 1 else f"{mode}_{precision}"


def median_ratio(faster: Side, slower: Side) -> float:
    return statistics.median(a / b for a, b in zip(faster.samples_per_s, slower.samples_per_s))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", help="preset name or YAML path (or --preset)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value config overrides")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="one of the reference configs a, b, c")
    parser.add_argument("--modes", nargs="+", choices=["eager", "compiled"], default=["eager", "compiled"])
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"],
                        help="time each (bf16 = autocast); default: the one training would use")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round and side")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation)")
    parser.add_argument("--threads", type=int, default=0, help="0 = the config's torch threads")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--vocab", type=int, default=0, help="0 = from the dataset metadata")
    parser.add_argument("--seq-len", type=int, default=0, help="0 = from the dataset metadata")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_intermixed_args(argv)
    if args.preset:  # what stands where the config would is a first override
        extra = [args.config, *args.overrides] if args.config else args.overrides
        preset = parser.parse_intermixed_args(PRESETS[args.preset])
        args.config, args.overrides = preset.config, [*preset.overrides, *extra]
        args.vocab, args.seq_len = args.vocab or preset.vocab, args.seq_len or preset.seq_len
    if args.precisions and len(set(args.precisions)) < len(args.precisions):
        parser.error(f"--precisions {' '.join(args.precisions)}: each at most once")
    if not args.config:
        parser.error("give a config (preset name or YAML path) or --preset")
    if args.steps < 1 or args.rounds < 1 or args.warmup < 1:
        parser.error(f"--steps={args.steps}, --rounds={args.rounds}, --warmup={args.warmup} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    result = run(args)
    for key, value in result.items():  # the key names carry the units
        print(f"{key:24s}", format(value, {float: ",.4g", int: ","}.get(type(value), "")))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
