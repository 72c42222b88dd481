"""Held-out evaluation of an ACT model: exact (whole-puzzle) and token accuracy, segments used.

In eval mode the ACT wrapper halts only at its segment limit (as the official code does); we also
record where the Q-head would have halted (first segment with q_halt_logits > 0) and the exact
accuracy had it halted there, so the compute the Q-head could save is visible.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

IGNORE = -100
SUM_KEYS = ("rows", "exact", "tokens_correct", "tokens", "segments", "q_segments", "q_exact")


@torch.no_grad()
def evaluate_batch(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Roll one batch through all ACT segments; returns per-metric sums (float64 scalars)."""
    carry = model.initial_carry(batch)
    rows = batch["labels"].shape[0]
    q_segments = torch.zeros(rows, dtype=torch.long, device=batch["labels"].device)
    q_exact = torch.zeros(rows, dtype=torch.bool, device=batch["labels"].device)
    segments = 0
    while True:
        carry, outputs = model(carry, batch)
        segments += 1
        exact, tokens_correct, tokens = _correctness(outputs["logits"], batch["labels"])
        stop_now = (outputs["q_halt_logits"] > 0) & (q_segments == 0)
        q_segments = torch.where(stop_now, segments, q_segments)
        q_exact = torch.where(stop_now, exact, q_exact)
        if bool(carry.halted.all()):
            break
    unset = q_segments == 0
    q_segments = torch.where(unset, segments, q_segments)
    q_exact = torch.where(unset, exact, q_exact)
    values = (rows, exact.sum(), tokens_correct.sum(), tokens.sum(), segments * rows,
              q_segments.sum(), q_exact.sum())
    return {k: torch.as_tensor(v, dtype=torch.float64) for k, v in zip(SUM_KEYS, values)}


def _correctness(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per row: exact match, correct tokens, supervised tokens. logits [B, L, V], labels [B, L]."""
    mask = labels != IGNORE
    correct = (logits.argmax(-1) == labels) & mask
    return correct.sum(-1) == mask.sum(-1), correct.sum(-1), mask.sum(-1)


def accumulate(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Sum ``evaluate_batch`` over batches (sums, so ranks can all-reduce before dividing)."""
    totals = {k: torch.zeros((), dtype=torch.float64) for k in SUM_KEYS}
    for batch in batches:
        for key, value in evaluate_batch(model, batch).items():
            totals[key] += value.cpu()
    return totals


def summarize(totals: dict[str, torch.Tensor], prefix: str = "eval/") -> dict[str, float]:
    """Turn summed counts into the reported metrics."""
    rows = max(float(totals["rows"]), 1.0)
    return {
        f"{prefix}exact_accuracy": float(totals["exact"]) / rows,
        f"{prefix}token_accuracy": float(totals["tokens_correct"]) / max(float(totals["tokens"]), 1.0),
        f"{prefix}mean_segments": float(totals["segments"]) / rows,
        f"{prefix}q_halt_segments": float(totals["q_segments"]) / rows,
        f"{prefix}q_halt_exact_accuracy": float(totals["q_exact"]) / rows,
        f"{prefix}rows": float(totals["rows"]),
    }
