"""GRAM's width axis: latency of N prior trajectories for one puzzle, run as one batch, against N=1.

    python bench/gram_sampling.py                           # sudoku4-gram, N = 1, 8, 20
    python bench/gram_sampling.py nqueens8-gram --num 1 20 64 --rounds 9 --json out.json
    python bench/gram_sampling.py sudoku4-gram-urm --compile     # the core torch.compile'd
    python bench/gram_sampling.py --bf16                         # under bf16 autocast

One call is what ``urm-ray eval`` / ``sample`` do per puzzle: ``sample_answers`` on one row
repeated N times (every ACT segment up to the limit, prior-guided, no gradient). The N values are
timed in interleaved rounds so the machine's load hits all alike; each figure is the median over
rounds, and ``over_n1`` is the ratio to N=1 of the same rounds. The weights are the preset's
initialisation: latency does not depend on what the model learned.

Each N also reports the call's matrix products: ``flop`` (counted) and ``matmul_ms``, the median
time of those products alone, replayed back to back on random operands of the same shapes,
strides and dtypes (timed in the same rounds), and ``floor_over_n1``, that time over the whole
N=1 call: the least ``over_n1`` a call running these products could reach on this machine (all
else it does only adds), since every trajectory's products are its own.
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from urm_ray.config import load_config
from urm_ray.data import builtin, stream
from urm_ray.data.config import DataConfig
from urm_ray.models.registry import TaskSpec, build_model
from urm_ray.train.compiled import compile_model
from urm_ray.eval.heldout import IGNORE, sample_answers


def one_puzzle(seq_len: int) -> dict[str, torch.Tensor]:
    return {"inputs": torch.ones(1, seq_len, dtype=torch.long),
            "labels": torch.full((1, seq_len), IGNORE, dtype=torch.long),
            "puzzle_identifiers": torch.zeros(1, dtype=torch.long)}


MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)


class MatmulRecorder(TorchDispatchMode):
    """Records every matrix product dispatched under it: (op, operands' (shape, stride), dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.products: list[tuple[torch._ops.OpOverload, list[tuple[torch.Size, tuple[int, ...]]], torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (the torch protocol)
        if func in MATMULS:
            operands = [a for a in args if isinstance(a, torch.Tensor)]
            self.products.append((func, [(a.shape, a.stride()) for a in operands], operands[-1].dtype))
        return func(*args, **(kwargs or {}))


def matmul_replay(model: torch.nn.Module, batch: dict[str, torch.Tensor], num: int) -> tuple[int, Callable[[], None]]:
    """(FLOPs, a function running the matrix products of one ``num``-trajectory call back to
    back on random operands of the same shapes, strides (transposed weights stay transposed) and
    dtypes)."""
    recorder = MatmulRecorder()
    with recorder:
        sample_answers(model, batch, num)
    calls = [(op, [torch.empty_strided(shape, stride, dtype=dtype).normal_() for shape, stride in operands])
             for op, operands, dtype in recorder.products]
    flops = sum(2 * a[-2].shape[-2] * a[-2].shape[-1] * a[-1].shape[-1] * (a[-1].shape[0] if op is MATMULS[2] else 1)
                for op, a in calls)

    def replay() -> None:
        for op, operands in calls:
            op(*operands)
    return flops, replay


def replay_time(replay: Callable[[], None], calls: int) -> float:
    """Median seconds of ``calls`` replays."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        replay()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def latency(model: torch.nn.Module, batch: dict[str, torch.Tensor], num: int, calls: int) -> float:
    """Median seconds of ``calls`` sampling calls of ``num`` trajectories."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        sample_answers(model, batch, num)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", nargs="?", default="sudoku4-gram")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--num", type=int, nargs="+", default=[1, 8, 20])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per N per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="torch.compile the core first (as train.compile)")
    parser.add_argument("--bf16", action="store_true", help="under bf16 autocast (as train.bf16=true)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_config(args.preset, args.overrides)
    meta = stream.load_meta(DataConfig(path=builtin.resolve_path(cfg.data.path)))
    task = TaskSpec(meta.vocab_size, meta.seq_len, meta.num_puzzle_identifiers)
    torch.manual_seed(0)
    model = build_model(cfg.model, task).eval()
    batch = one_puzzle(meta.seq_len)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        replays = {num: matmul_replay(model, batch, num) for num in args.num}  # the model's products, eager
        if args.compile:
            compile_model(model)  # one graph per N: compiled in the warm-up below
        for num in args.num:  # warm-up: allocator, thread pool, compiled graphs
            latency(model, batch, num, 2)
            replay_time(replays[num][1], 2)
        rounds: dict[int, list[float]] = {num: [] for num in args.num}
        products: dict[int, list[float]] = {num: [] for num in args.num}
        for _ in range(args.rounds):
            for num in args.num:
                rounds[num].append(latency(model, batch, num, args.calls))
                products[num].append(replay_time(replays[num][1], args.calls))
    base = rounds[min(args.num)]
    result = {"preset": args.preset, "threads": args.threads, "rounds": args.rounds, "compiled": args.compile,
              "bf16": args.bf16, "segments": cfg.model.max_segments, "results": [
                  {"num": num, "ms": round(1e3 * statistics.median(ts), 2),
                   "over_n1": round(statistics.median(t / b for t, b in zip(ts, base)), 2),
                   "flop": replays[num][0],
                   "matmul_ms": round(1e3 * statistics.median(products[num]), 2),
                   # the products alone against the whole N=1 call: the least over_n1 a call
                   # running these products could reach here
                   "floor_over_n1": round(statistics.median(p / b for p, b in zip(products[num], base)), 2)}
                  for num, ts in rounds.items()]}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
