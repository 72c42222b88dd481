"""Every family's forward and loss on a device (bf16 autocast, compiled) against CPU fp32.

    python bench/gpu_parity.py --device cuda --json parity.json     # part of bench/gpu_check.sh
    python bench/gpu_parity.py --device cpu --no-bf16                # the same harness on a CPU

One segment in train mode from the same weights and batch on both sides. ACT exploration is off
and GRAM's noise is drawn as zeros (eps = the posterior mean), so both sides compute the same
function; what is compared is the relative 2-norm error of the loss (1e-2 allowed) and of the
logits (3e-2 allowed: bf16 keeps 8 significant bits, and the error grows over the looped block
passes; on this project's CPU with bf16 autocast the logits differ by 0.6-1.7 %), and the share of
tokens whose argmax agrees.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from urm_ray.config import load_config
from urm_ray.models.registry import TaskSpec, build_model
from urm_ray.objectives import Objective, objective_for
from urm_ray.train.compiled import compile_model

TASK = TaskSpec(vocab_size=11, seq_len=81, num_puzzle_identifiers=4)
FAMILIES = {  # the sudoku4 presets on the 9x9 Sudoku shape, with a puzzle embedding for URM
    "urm": ["model.puzzle_emb_dim=64"],
    "hrm": [],
    "trm": [],
    "gram": [],
    "gram_urm": [],
    "transformer": [],
}


def _batch(rows: int, device: torch.device) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, TASK.vocab_size, (rows, TASK.seq_len), generator=gen, dtype=torch.int32)
    ids = torch.randint(0, TASK.num_puzzle_identifiers, (rows,), generator=gen, dtype=torch.int32)
    batch = {"inputs": inputs, "labels": inputs.long(), "puzzle_identifiers": ids}
    return {k: v.to(device) for k, v in batch.items()}


def _segment(model: torch.nn.Module, objective: Objective, device: torch.device, bf16: bool) -> tuple[torch.Tensor, ...]:
    """(logits, loss) of one train-mode segment, float32 on the CPU."""
    batch = _batch(16, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    with mock.patch("torch.randn_like", torch.zeros_like), autocast:
        carry, outputs = model.train()(model.initial_carry(batch), batch)
        loss, _ = objective(outputs, carry)
    return outputs["logits"].detach().float().cpu(), loss.detach().float().cpu()


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-12))


def check(family: str, device: torch.device, bf16: bool, compiled: bool) -> dict[str, Any]:
    cfg = load_config(f"sudoku4-{family.replace('_', '-')}", [*FAMILIES[family], "model.halt_exploration_prob=0"])
    torch.manual_seed(0)
    reference = build_model(cfg.model, TASK)
    model = copy.deepcopy(reference).to(device)
    objective = objective_for(cfg)
    logits_ref, loss_ref = _segment(reference, objective, torch.device("cpu"), bf16=False)
    if compiled:
        compile_model(model)
        objective = objective.compiled()
    logits, loss = _segment(model, objective, device, bf16)
    return {"family": family, "logits_rel_err": _relative(logits, logits_ref),
            "loss_rel_err": _relative(loss, loss_ref), "loss_cpu_fp32": float(loss_ref),
            "argmax_agree": float((logits.argmax(-1) == logits_ref.argmax(-1)).float().mean())}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-bf16", action="store_true", help="fp32 on the device too")
    parser.add_argument("--eager", action="store_true", help="do not compile the device side")
    parser.add_argument("--families", nargs="+", default=sorted(FAMILIES), choices=sorted(FAMILIES))
    parser.add_argument("--loss-tolerance", type=float, default=1e-2)
    parser.add_argument("--logits-tolerance", type=float, default=3e-2)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = [check(f, torch.device(args.device), not args.no_bf16, not args.eager) for f in args.families]
    for row in rows:
        row["ok"] = (row["loss_rel_err"] <= args.loss_tolerance
                     and row["logits_rel_err"] <= args.logits_tolerance)
        print(f"{row['family']:12s} logits {row['logits_rel_err']:.2e}  loss {row['loss_rel_err']:.2e}"
              f"  argmax agree {row['argmax_agree']:.1%}  {'ok' if row['ok'] else 'FAIL'}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
