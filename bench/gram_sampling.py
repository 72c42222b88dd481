"""GRAM's width axis: latency of N prior trajectories for one puzzle, run as one batch, against N=1.

    python bench/gram_sampling.py                           # sudoku4-gram, N = 1, 8, 20
    python bench/gram_sampling.py nqueens8-gram --num 1 20 64 --rounds 9 --json out.json
    python bench/gram_sampling.py sudoku4-gram-urm --compile     # the core torch.compile'd

One call is what ``urm-ray eval`` / ``sample`` do per puzzle: ``sample_answers`` on one row
repeated N times (every ACT segment up to the limit, prior-guided, no gradient). The N values are
timed in interleaved rounds so the machine's load hits all alike; each figure is the median over
rounds, and ``over_n1`` is the ratio to N=1 of the same rounds. The weights are the preset's
initialisation: latency does not depend on what the model learned.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from urm_ray.config import load_config
from urm_ray.data import builtin, stream
from urm_ray.data.config import DataConfig
from urm_ray.models.registry import TaskSpec, build_model
from urm_ray.train.compiled import compile_model
from urm_ray.train.evaluate import IGNORE, sample_answers


def one_puzzle(seq_len: int) -> dict[str, torch.Tensor]:
    return {"inputs": torch.ones(1, seq_len, dtype=torch.long),
            "labels": torch.full((1, seq_len), IGNORE, dtype=torch.long),
            "puzzle_identifiers": torch.zeros(1, dtype=torch.long)}


def latency(model: torch.nn.Module, batch: dict[str, torch.Tensor], num: int, calls: int) -> float:
    """Median seconds of ``calls`` sampling calls of ``num`` trajectories."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        sample_answers(model, batch, num)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", nargs="?", default="sudoku4-gram")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--num", type=int, nargs="+", default=[1, 8, 20])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per N per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="torch.compile the core first (as train.compile)")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.preset, args.overrides)
    meta = stream.load_meta(DataConfig(path=builtin.resolve_path(cfg.data.path)))
    task = TaskSpec(meta.vocab_size, meta.seq_len, meta.num_puzzle_identifiers)
    torch.manual_seed(0)
    model = build_model(cfg.model, task).eval()
    if args.compile:
        compile_model(model)  # one graph per N: compiled in the warm-up below
    batch = one_puzzle(meta.seq_len)
    for num in args.num:  # warm-up: allocator and thread pool
        latency(model, batch, num, 2)
    rounds: dict[int, list[float]] = {num: [] for num in args.num}
    for _ in range(args.rounds):
        for num in args.num:
            rounds[num].append(latency(model, batch, num, args.calls))
    base = rounds[min(args.num)]
    result = {"preset": args.preset, "threads": args.threads, "rounds": args.rounds, "compiled": args.compile,
              "segments": cfg.model.max_segments, "results": [
                  {"num": num, "ms": round(1e3 * statistics.median(ts), 2),
                   "over_n1": round(statistics.median(t / b for t, b in zip(ts, base)), 2)}
                  for num, ts in rounds.items()]}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
