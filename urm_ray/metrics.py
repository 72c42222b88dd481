"""What an answer scores, whoever produced it: exact and per-token accuracy, and pass@k by vote.

Plain tensors and values only (no model, no data, no config), so the in-run evaluation, the
offline evaluation of a checkpoint and a task's own score (ARC's) all count alike.

    exact(answers, labels)                       # [..., B] bool: every supervised token right
    correct, supervised = token_counts(answers, labels)
    ranked = ranked_votes(answers, q)            # one test pair's distinct answers, best first
    pass_at_k(place(ranked, truth), k)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

IGNORE = -100  # the label of a position that is not supervised


def exact(answers: Tensor, labels: Tensor) -> Tensor:
    """[..., B] bool: the answer equals the label on every supervised token. answers, labels
    [..., B, L] (answers may carry leading trajectory dimensions)."""
    mask = labels != IGNORE
    return ((answers == labels) | ~mask).all(-1)


def token_counts(answers: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Per row [B]: correct supervised tokens, supervised tokens. answers, labels [B, L]."""
    mask = labels != IGNORE
    return ((answers == labels) & mask).sum(-1), mask.sum(-1)


@dataclass
class Candidate:
    """One distinct answer of a test pair and its votes (with the sum of their halting scores)."""

    votes: int = 0
    q_sum: float = 0.0

    @property
    def score(self) -> tuple[int, float]:
        return self.votes, self.q_sum / max(self.votes, 1)


def rank(candidates: dict[bytes, Candidate]) -> list[bytes]:
    """Answers by votes, then mean halting score; ties keep the order first seen."""
    return sorted(candidates, key=lambda answer: candidates[answer].score, reverse=True)


def ranked_votes(answers: Sequence[bytes], q: Sequence[float] | None = None) -> list[bytes]:
    """Ranked distinct answers of one test pair from its predictions (and halting scores)."""
    candidates: dict[bytes, Candidate] = {}
    for i, answer in enumerate(answers):
        candidate = candidates.setdefault(answer, Candidate())
        candidate.votes += 1
        candidate.q_sum += 0.0 if q is None else float(q[i])
    return rank(candidates)


def place(ranked: Sequence[bytes], truth: bytes) -> int:
    """Where the true answer is among the ranked answers (0 = first); -1 when it is not there."""
    return ranked.index(truth) if truth in ranked else -1


def pass_at_k(place: int, k: int) -> bool:
    """The true answer, at ``place`` (see ``place``), is among the first k ranked answers."""
    return 0 <= place < k
