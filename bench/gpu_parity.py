"""Numerics of the training step on a GPU: fp32 against the CPU, and bf16's error apart from compile's.

    python bench/gpu_parity.py fp32 --out results.jsonl     # steps 1 and 2 of bench/gpu_check.sh
    python bench/gpu_parity.py bf16 --out results.jsonl
    python bench/gpu_parity.py fp32 --out results.jsonl --dry-run   # the same on the CPU, as its test

One ``train_step`` (ACT segment, backward, optimizers, EMA) of every family at tests/tiny.py's
size, from the same weights and batch on both sides; compared are the step's loss (the sum of its
``*_loss`` metrics), the gradients of every parameter and puzzle-embedding row (relative 2-norm of
all of them together), and the weights after the optimizer step.

``fp32``: CUDA against CPU, both eager fp32 with TF32 off; GRAM's noise is drawn on the CPU for
both. Tolerances: loss 1e-5 and gradients 1e-4 relative (fp32 keeps 24 bits; the two devices sum
in other orders), and at most 1 in 1000 weights moved differently by more than 1e-3 of the
learning rate: AdamAtan2's first step is close to lr * sign(gradient), so a gradient element within
rounding of zero may step the other way on the other device, while a wrong update moves most.

``bf16``: on the GPU, eager bf16 autocast against eager fp32 (bf16's error), the same with
``model.bf16_states`` (bf16 carry and residual stream), and for the --compiled families compiled
bf16 against eager bf16 (what compiling adds), with inductor's random numbers drawn as eager's
(``fallback_random``). Tolerances: loss 1e-2 and gradients 1e-1
relative (bf16 keeps 8 bits, and the error grows over the looped passes).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import torch
import torch._inductor.config

from gpu_common import (FAMILIES, TASK, TINY, Results, cpu_drawn_noise, device_for, parser, random_batch,
                        relative, run_config, tiny_config)
from urm_ray.config import RunConfig
from urm_ray.train.step import TrainState, build_state, train_step

FP32_TOLERANCE = {"loss_rel_err": 1e-5, "grad_rel_err": 1e-4, "update_mismatch": 1e-3}
BF16_TOLERANCE = {"loss_rel_err": 1e-2, "grad_rel_err": 1e-1}
Noise = Callable[[], AbstractContextManager]


@dataclass
class Stepped:
    """One training step's outcome, flattened to float64 on the CPU."""

    loss: float
    gradients: torch.Tensor  # every parameter's and puzzle-embedding row's gradient
    weights: torch.Tensor  # the floating state after the step
    update: torch.Tensor  # weights after minus before
    lr: float


def flat_state(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([t.detach().double().cpu().flatten() for t in model.state_dict().values()
                      if t.is_floating_point()])


def capture_gradients(state: TrainState) -> list[torch.Tensor]:
    """Filled with every gradient when the first optimizer steps (all exist then, none is used)."""
    captured: list[torch.Tensor] = []
    first = state.optimizers[0]
    step = first.step

    def step_after_capture(*args, **kwargs):  # noqa: ANN002, ANN003 (the optimizer's own signature)
        captured.extend(p.grad.detach().double().cpu().flatten() for p in state.model.parameters()
                        if p.grad is not None)
        puzzle_emb = getattr(state.model, "puzzle_emb", None)
        rows = puzzle_emb.trained_rows() if puzzle_emb is not None else None
        if rows is not None:
            captured.append(rows[1].detach().double().cpu().flatten())
        return step(*args, **kwargs)

    first.step = step_after_capture
    return captured


def one_step(cfg: RunConfig, device: torch.device, noise: Noise) -> Stepped:
    state = build_state(cfg, TASK, device)
    before = flat_state(state.model)
    gradients = capture_gradients(state)
    with noise():
        metrics = train_step(state, random_batch(cfg.train.global_batch_size, TASK, device))
    loss = sum(float(v) for k, v in metrics.items() if k.endswith("loss"))
    after = flat_state(state.model)
    return Stepped(loss, torch.cat(gradients), after, after - before, state.lr)


def compare(got: Stepped, ref: Stepped, tolerance: dict[str, float]) -> dict[str, object]:
    errors = {"loss_rel_err": abs(got.loss - ref.loss) / max(abs(ref.loss), 1e-30),
              "grad_rel_err": relative(got.gradients, ref.gradients),
              "weights_rel_err": relative(got.weights, ref.weights),
              "update_mismatch": float(((got.update - ref.update).abs() > 1e-3 * ref.lr).double().mean())}
    ok = all(errors[key] <= limit for key, limit in tolerance.items())  # nan fails
    return {"status": "ok" if ok else "FAIL", "loss": ref.loss, **errors, "tolerance": tolerance}


def strict_fp32() -> None:
    """IEEE fp32 matmuls and convolutions on CUDA (PyTorch lets cuDNN use TF32 by default)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def fp32(args: argparse.Namespace, device: torch.device, results: Results) -> None:
    strict_fp32()
    cpu = torch.device("cpu")
    for family in args.families:
        cfg = tiny_config(family, bf16=False, compile=False)
        results.guarded({"family": family, "device": str(device)}, lambda: compare(
            one_step(cfg, device, functools.partial(cpu_drawn_noise, 1)),
            one_step(cfg, cpu, functools.partial(cpu_drawn_noise, 1)), FP32_TOLERANCE))


@contextmanager
def reseeded(seed: int) -> Iterator[None]:
    """The generators reseeded before a step: both sides on one device draw the same noise."""
    torch.manual_seed(seed)
    yield


def bf16(args: argparse.Namespace, device: torch.device, results: Results) -> None:
    strict_fp32()
    torch._inductor.config.fallback_random = True  # compiled random draws = eager's
    comparisons = [(family, "eager bf16 vs eager fp32", (True, False, False), (False, False, False))
                   for family in args.families]
    comparisons += [(family, "eager bf16 states vs eager fp32", (True, False, True), (False, False, False))
                    for family in args.families]
    comparisons += [(family, "compiled bf16 vs eager bf16", (True, True, False), (True, False, False))
                    for family in args.families if family in args.compiled]  # after every eager one
    for family, name, got, ref in comparisons:
        results.guarded({"family": family, "compare": name, "device": str(device)}, lambda: compare(
            bf16_step(family, *got, device), bf16_step(family, *ref, device), BF16_TOLERANCE))


@functools.cache
def bf16_step(family: str, bf16: bool, compile: bool, states: bool, device: torch.device) -> Stepped:
    """One step of ``family`` on ``device`` (``states``: ``model.bf16_states``), the generators
    reseeded first (kept: eager bf16 and eager fp32 are the references of several comparisons)."""
    cfg = run_config({**TINY, **FAMILIES[family], "train.bf16": bf16, "train.compile": compile,
                      "model.bf16_states": states})
    return one_step(cfg, device, functools.partial(reseeded, 1))


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("what", choices=["fp32", "bf16"])
    p.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=list(FAMILIES))
    p.add_argument("--compiled", nargs="*", choices=sorted(FAMILIES), default=["urm", "gram_urm"],
                   help="bf16: the families also compared compiled against eager")
    args = p.parse_args()
    device = device_for(args)
    check, run = {"fp32": ("parity_fp32", fp32), "bf16": ("bf16_error", bf16)}[args.what]
    run(args, device, Results(args.out, check))


if __name__ == "__main__":
    main()
