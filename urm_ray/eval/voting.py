"""Combining K sampled answers per puzzle: majority vote and coverage (GRAM's width axis).

Answers are integer token tensors [K, B, L]: K samples (trajectories) for each of B rows.
Two samples are the same answer when every one of their L tokens agrees.

    voted = majority_vote(answers)              # [B, L]
    found = coverage(answers, is_valid)         # [B] distinct valid answers per row
"""

from __future__ import annotations

import torch
from torch import Tensor


def same_answer(answers: Tensor) -> Tensor:
    """[K, K, B] bool: samples i and j of a row hold the same answer. answers: [K, B, L]."""
    assert answers.ndim == 3, f"answers must be [K, B, L], got shape {tuple(answers.shape)}"
    return (answers.unsqueeze(1) == answers.unsqueeze(0)).all(-1)


def majority_vote(answers: Tensor) -> Tensor:
    """The most frequent answer per row [B, L]; ties go to the answer sampled first.

    Each sample is scored by how many samples share its answer; ``argmax`` returns the first
    maximum, i.e. the earliest sample of the most frequent answers, so the result depends only
    on the sample order, never on token values.
    """
    counts = same_answer(answers).sum(1)  # [K, B]
    winner = counts.argmax(0)  # [B]: first index of the largest count
    return answers.gather(0, winner.view(1, -1, 1).expand(1, *answers.shape[1:])).squeeze(0)


def coverage(answers: Tensor, is_valid: Tensor) -> Tensor:
    """Distinct valid answers per row [B] (int64). answers: [K, B, L]; is_valid: [K, B] bool.

    An answer counts once however often it was sampled, and counts if any of its samples is
    marked valid (validity is a property of the answer, so all its samples should agree).
    """
    assert is_valid.shape == answers.shape[:2], (
        f"is_valid {tuple(is_valid.shape)} must match answers' [K, B] {tuple(answers.shape[:2])}"
    )
    same = same_answer(answers)  # [K, K, B]
    earlier = torch.tril(torch.ones(same.shape[:2], dtype=torch.bool, device=same.device), -1)
    first = ~(same & earlier.unsqueeze(-1)).any(1)  # [K, B]: no earlier sample has this answer
    valid = (same & is_valid.unsqueeze(0)).any(1)  # [K, B]: some sample of this answer is valid
    return (first & valid).sum(0)
