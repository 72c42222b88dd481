"""GRAM's width on a GPU: the latency of N = 20 prior trajectories of one puzzle against N = 1.

    python bench/gpu_sampling.py --out results.jsonl     # step 7 of bench/gpu_check.sh

``bench/gram_sampling.py`` on the GPU: one call is what ``urm-ray eval`` / ``sample`` do per puzzle,
``sample_answers`` on one row repeated N times (every ACT segment, prior-guided, no gradient),
here at the sudoku4-gram preset's size on the 4x4 Sudoku shape, eager, under bf16 autocast (as
evaluation on a GPU runs). The N values are timed in interleaved rounds; each figure is the
median over rounds of the median call, and ``over_n1`` the median per-round ratio to N = 1. On a
CPU N trajectories cost about N times one; on a GPU a batch of 20 rows should cost about one.
"""

from __future__ import annotations

import statistics
import time

import torch

from gpu_common import Results, device_for, parser, random_batch, run_config, synchronize
from urm_ray.eval.heldout import sample_answers
from urm_ray.models.registry import build_model
from urm_ray.models.task import TaskSpec

SUDOKU4 = TaskSpec(vocab_size=6, seq_len=16, num_puzzle_identifiers=1)
GRAM = {"model.name": "gram", "model.hidden_size": 64, "model.num_heads": 4, "model.expansion": 2.0,
        "model.num_layers": 2, "model.h_cycles": 2, "model.l_cycles": 2, "model.max_segments": 4,
        "model.puzzle_emb_dim": 0, "model.puzzle_emb_len": 0, "model.latent_dim": 16}


def latency(model: torch.nn.Module, batch: dict, num: int, calls: int, device: torch.device) -> float:
    """Median seconds of ``calls`` calls of ``num`` trajectories."""
    times = []
    for _ in range(calls):
        synchronize(device)
        start = time.perf_counter()
        sample_answers(model, batch, num)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--num", type=int, nargs="+", default=[1, 20])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=5, help="timed calls per N per round")
    args = p.parse_args()
    device = device_for(args)
    results = Results(args.out, "gram_sampling")
    torch.manual_seed(0)
    model = build_model(run_config(GRAM).model, SUDOKU4).to(device).eval()
    batch = random_batch(1, SUDOKU4, device)
    rounds, calls = (2, 2) if args.dry_run else (args.rounds, args.calls)
    times: dict[int, list[float]] = {num: [] for num in args.num}
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        for num in args.num:  # warm-up: allocator, kernels
            latency(model, batch, num, 2, device)
        for _ in range(rounds):
            for num in args.num:
                times[num].append(latency(model, batch, num, calls, device))
    base = times[min(args.num)]
    for num, ts in times.items():
        results.write("ok", num=num, ms=round(1e3 * statistics.median(ts), 3), rounds=rounds, calls=calls,
                      over_n1=round(statistics.median(t / b for t, b in zip(ts, base)), 2),
                      bf16=device.type == "cuda", device=str(device))


if __name__ == "__main__":
    main()
