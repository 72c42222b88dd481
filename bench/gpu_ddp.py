"""DDP and torch.compile together on one GPU: NCCL at world size 1, losses equal to the plain step.

    python bench/gpu_ddp.py --out results.jsonl     # step 8 of bench/gpu_check.sh (gloo on --dry-run)

A process group of one rank (NCCL, a TCP store on localhost) and two training states from the
same weights, both with ``train.compile``: one wrapped in ``DistributedDataParallel`` as Ray Train's
``prepare_model`` wraps it (``broadcast_buffers=False``), one plain. Both take the same steps on
the same batches; with one rank the all-reduce averages over one, so every loss and the weights
after the last step must agree (fp32, relative 1e-6). URM's puzzle embedding all-gathers its rows
through the group; GRAM-URM has the parameters DDP requires to take a gradient every step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gpu_common import TASK, Results, device_for, parser, random_batch, relative, tiny_config
from gpu_parity import flat_state
from urm_ray.train.step import TrainState, build_state, train_step

TOLERANCE = 1e-6


def losses(state: TrainState, steps: int) -> list[float]:
    out = []
    for i in range(steps):
        torch.manual_seed(i)  # the same draws on both sides
        metrics = train_step(state, random_batch(state.local_batch, TASK, state.device, seed=i))
        out.append(sum(float(v) for k, v in metrics.items() if k.endswith("loss")))
    return out


def compare(family: str, device: torch.device, steps: int) -> dict[str, object]:
    cfg = tiny_config(family, bf16=False, compile=True)

    def ddp(model: torch.nn.Module) -> torch.nn.Module:
        ids = [device.index or 0] if device.type == "cuda" else None
        return DistributedDataParallel(model.to(device), device_ids=ids, broadcast_buffers=False)

    wrapped, plain = build_state(cfg, TASK, device, wrap=ddp), build_state(cfg, TASK, device)
    assert isinstance(wrapped.wrapped, DistributedDataParallel)
    got, expected = losses(wrapped, steps), losses(plain, steps)
    loss_err = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(got, expected))
    weights_err = relative(flat_state(wrapped.model), flat_state(plain.model))
    ok = loss_err <= TOLERANCE and weights_err <= TOLERANCE
    return {"status": "ok" if ok else "FAIL", "losses_ddp": got, "losses_plain": expected,
            "loss_rel_err": loss_err, "weights_rel_err": weights_err, "tolerance": TOLERANCE}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--families", nargs="+", choices=["urm", "gram_urm"], default=["urm", "gram_urm"])
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    device = device_for(args)
    backend = "nccl" if device.type == "cuda" else "gloo"
    store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True)  # port 0: any free one
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    results = Results(args.out, "ddp")
    try:
        for family in args.families:
            results.guarded({"family": family, "backend": backend, "steps": args.steps, "device": str(device)},
                            lambda: compare(family, device, args.steps))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
