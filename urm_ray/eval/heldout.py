"""Held-out evaluation of an ACT model: exact (whole-puzzle) and token accuracy, segments used.

In eval mode the ACT wrapper halts only at its segment limit (as the official code does); we also
record where the Q-head would have halted (first segment with q_halt_logits > 0) and the exact
accuracy had it halted there, so the compute the Q-head could save is visible.

For stochastic models (GRAM), ``evaluate_sampled`` draws K trajectories per row from the prior in
one batch, majority-votes them and counts distinct valid answers (coverage);
``generate_unconditional`` samples K boards from an all-blank input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Optional

import torch
from torch import nn

from urm_ray.eval.voting import coverage, majority_vote
from urm_ray.metrics import IGNORE, exact, token_counts
from urm_ray.models.registry import family_of

SUM_KEYS = ("rows", "exact", "tokens_correct", "tokens", "segments", "q_segments", "q_exact", "valid")

# (answers, inputs, labels) [N, L] tokens -> [N] bool, e.g. a task verifier
# (``urm_ray.data.tasks.verify``) that accepts any valid solution.
Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@torch.no_grad()
def evaluate_batch(
    model: nn.Module, batch: dict[str, torch.Tensor], verifier: Optional[Verifier] = None
) -> dict[str, torch.Tensor]:
    """Roll one batch through all ACT segments; returns per-metric sums (float64 scalars).

    ``valid`` counts final answers that ``verifier`` accepts (any valid solution, for tasks with
    several); without a verifier it equals ``exact``. The model must be in eval mode, where every
    row halts at the segment limit: the rollout runs that many segments and never asks the device
    whether it is done (no host sync per segment)."""
    _require_eval(model, "evaluate_batch")
    carry = model.initial_carry(batch)
    rows = batch["labels"].shape[0]
    q_segments = torch.zeros(rows, dtype=torch.long, device=batch["labels"].device)
    q_exact = torch.zeros(rows, dtype=torch.bool, device=batch["labels"].device)
    segments = model.max_segments
    for segment in range(1, segments + 1):
        carry, outputs = model(carry, batch)
        exact, tokens_correct, tokens = _correctness(outputs["logits"], batch["labels"])
        stop_now = (outputs["q_halt_logits"] > 0) & (q_segments == 0)
        q_segments = torch.where(stop_now, segment, q_segments)
        q_exact = torch.where(stop_now, exact, q_exact)
    unset = q_segments == 0
    q_segments = torch.where(unset, segments, q_segments)
    q_exact = torch.where(unset, exact, q_exact)
    valid = exact
    if verifier is not None:
        answers = outputs["logits"].argmax(-1)
        valid = verifier(answers, batch["inputs"], batch["labels"]).to(exact.device)
    values = (rows, exact.sum(), tokens_correct.sum(), tokens.sum(), segments * rows,
              q_segments.sum(), q_exact.sum(), valid.sum())
    return {k: torch.as_tensor(v, dtype=torch.float64) for k, v in zip(SUM_KEYS, values)}


def _require_eval(model: nn.Module, caller: str) -> None:
    """ValueError unless ``model`` is in eval mode (an ACT model then halts only at its limit)."""
    if model.training:
        raise ValueError(f"{caller} needs model.eval(): in training mode rows halt by the Q-head and "
                         "restart on fresh data (and GRAM samples from its posterior, which reads the labels)")


def _correctness(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per row: exact match, correct tokens, supervised tokens. logits [B, L, V], labels [B, L]."""
    return _answer_correctness(logits.argmax(-1), labels)


def _answer_correctness(answers: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per row: exact match, correct tokens, supervised tokens. answers, labels [B, L]."""
    return (exact(answers, labels), *token_counts(answers, labels))


def accumulate(per_batch: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
               batches: Iterable[dict[str, torch.Tensor]], keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Sum ``per_batch``'s float64 sums over batches (sums, so ranks can all-reduce before
    dividing); every key starts at 0, so a rank without batches still contributes all of them.
    The sums stay on the device until the last batch: one read back per key, not per batch."""
    totals: dict[str, torch.Tensor] = {}
    for batch in batches:
        for key, value in per_batch(batch).items():
            totals[key] = totals[key] + value if key in totals else value
    return {k: totals[k].cpu() if k in totals else torch.zeros((), dtype=torch.float64) for k in keys}


# reported metric -> (numerator, denominator) among the summed counts
METRICS = {
    "exact_accuracy": ("exact", "rows"),
    "token_accuracy": ("tokens_correct", "tokens"),
    "mean_segments": ("segments", "rows"),
    "q_halt_segments": ("q_segments", "rows"),
    "q_halt_exact_accuracy": ("q_exact", "rows"),
    # answers the task verifier accepts (any valid solution); = exact_accuracy without one
    "valid_accuracy": ("valid", "rows"),
}
# the same for ``evaluate_sampled``'s counts: the voted answer, and the samples per row
SAMPLED_METRICS = {
    "vote_exact_accuracy": ("exact", "rows"),
    "vote_token_accuracy": ("tokens_correct", "tokens"),
    "vote_valid": ("valid", "rows"),
    "sample_valid": ("sample_valid", "rows"),
    "coverage": ("coverage", "rows"),
    "mean_segments": ("segments", "rows"),
}


def summarize(totals: dict[str, torch.Tensor], metrics: dict[str, tuple[str, str]] = METRICS,
              prefix: str = "eval/") -> dict[str, float]:
    """Turn summed counts into the reported ``metrics`` (ratios of counts) and the row count."""
    out = {f"{prefix}{name}": float(totals[num]) / max(float(totals[den]), 1.0)
           for name, (num, den) in metrics.items()}
    return {**out, f"{prefix}rows": float(totals["rows"])}


def held_out_metrics(
    model: nn.Module, batches: Callable[[], Iterable[dict[str, torch.Tensor]]], num_samples: int = 0,
    verifier: Optional[Verifier] = None,
    reduce: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] = lambda sums: sums,
) -> dict[str, float]:
    """The evaluation a run reports: ``summarize`` of one pass over ``batches()`` (its
    ``valid_accuracy`` judged by ``verifier``), plus, when
    ``num_samples`` > 0, the majority vote over that many sampled trajectories and its coverage
    (a second pass). ``reduce`` combines the sums across ranks before dividing."""
    metrics = summarize(reduce(accumulate(lambda b: evaluate_batch(model, b, verifier), batches(), SUM_KEYS)))
    if num_samples:
        sums = accumulate(lambda b: evaluate_sampled(model, b, num_samples, verifier), batches(),
                          SAMPLED_SUM_KEYS)
        sampled = summarize(reduce(sums), SAMPLED_METRICS)
        metrics = {**sampled, **metrics}
    return metrics


# --- sampled (stochastic-model) evaluation -------------------------------------------------------

SAMPLED_SUM_KEYS = ("rows", "exact", "tokens_correct", "tokens", "segments", "valid", "sample_valid",
                    "coverage")


@torch.no_grad()
def sample_answers(model: nn.Module, batch: dict[str, torch.Tensor], num_samples: int) -> tuple[torch.Tensor, int]:
    """K = ``num_samples`` trajectories per row, run as ONE batch of K * B rows (sample-major).

    Returns (answers [K, B, L], ACT segments run). Every trajectory runs to the ACT limit and
    answers there, unless the model's ``sample_halt`` is "q" (GRAM's ``model.sample_halt``, the
    paper's inference): then a trajectory answers at the first segment whose halt head says halt
    (q_halt_logits > 0), or at the limit. The model must be in eval mode: in training GRAM guides
    with its posterior, which sees the labels.

    At the limit the rollout runs the model's ``max_segments`` without a host sync. With "q" it
    reads one flag per segment back from the device, whether every trajectory has answered, and
    stops there: the segments saved are what halting on Q is for.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be >= 1")
    _require_eval(model, "sample_answers")
    repeated = {k: v.repeat(num_samples, *([1] * (v.ndim - 1))) for k, v in batch.items()}
    carry = model.initial_carry(repeated)
    on_q = family_of(model).sample_halt(model) == "q"
    answers, done, segments = None, torch.zeros_like(carry.halted), 0
    while segments < model.max_segments:
        carry, outputs = model(carry, repeated)
        segments += 1
        decoded = outputs["logits"].argmax(-1)
        answers = decoded if answers is None else torch.where(done.unsqueeze(-1), answers, decoded)
        if on_q:
            done = done | (outputs["q_halt_logits"] > 0)
            if bool(done.all()):  # the early stop's one host read per segment
                break
    return answers.view(num_samples, *batch["labels"].shape), segments


@torch.no_grad()
def evaluate_sampled(
    model: nn.Module, batch: dict[str, torch.Tensor], num_samples: int, verifier: Optional[Verifier] = None
) -> dict[str, torch.Tensor]:
    """Majority vote over K sampled trajectories per row; per-metric sums (float64 scalars).

    ``exact`` / ``tokens_correct`` / ``tokens`` score the voted answer against the labels like
    ``evaluate_batch``. ``verifier`` (default: equals the label) judges answers: ``valid`` counts
    rows whose voted answer it accepts, ``sample_valid`` sums each row's fraction of accepted
    samples, and ``coverage`` sums each row's number of distinct accepted answers.
    """
    labels = batch["labels"]
    answers, segments = sample_answers(model, batch, num_samples)  # [K, B, L]
    voted = majority_vote(answers)  # [B, L]
    exact, tokens_correct, tokens = _answer_correctness(voted, labels)
    if verifier is None:
        accepted = _answer_correctness(answers.flatten(0, 1), labels.repeat(num_samples, 1))[0]
        voted_ok = exact
    else:
        inputs = batch["inputs"]
        accepted = verifier(answers.flatten(0, 1), inputs.repeat(num_samples, 1),
                            labels.repeat(num_samples, 1))  # sample-major, as ``answers``
        voted_ok = verifier(voted, inputs, labels)
    accepted = accepted.to(labels.device, torch.bool).view(num_samples, -1)  # [K, B]
    rows = labels.shape[0]
    values = (rows, exact.sum(), tokens_correct.sum(), tokens.sum(), segments * rows, voted_ok.sum(),
              accepted.double().mean(0).sum(), coverage(answers, accepted).sum())
    return {k: torch.as_tensor(v, dtype=torch.float64) for k, v in zip(SAMPLED_SUM_KEYS, values)}


@torch.no_grad()
def generate_unconditional(model: nn.Module, num_samples: int, blank_token: int = 1) -> torch.Tensor:
    """K boards [K, L] sampled from an all-blank input (GRAM's unconditional generation).

    The input is ``blank_token`` everywhere (the N-Queens and Sudoku datasets' blank) with puzzle
    identifier 0; L is the model's ``task.seq_len``.
    """
    device = next(model.parameters()).device
    length = model.task.seq_len
    batch = {
        "inputs": torch.full((1, length), blank_token, dtype=torch.long, device=device),
        "labels": torch.full((1, length), IGNORE, dtype=torch.long, device=device),
        "puzzle_identifiers": torch.zeros(1, dtype=torch.long, device=device),
    }
    return sample_answers(model, batch, num_samples)[0][:, 0]
