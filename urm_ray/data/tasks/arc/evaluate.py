"""ARC evaluation by augmentation voting: pass@1, pass@2 and pass@k per task, as the ARC rules
and the official evaluator count them.

For every held-out test pair the model runs on K augmented versions (aug indices 0..K-1, the
transforms and puzzle identifiers training used, no translation); a task with fewer distinct
versions than K runs on each of them once (the indices beyond would repeat one, voting twice).
Each prediction is cropped (largest top-left rectangle of colour tokens), mapped back through the
inverse dihedral and colour permutation, and counts as one vote for that grid. Candidates rank by
votes, then by the mean Q-head halting probability of their votes; pass@k holds when the true
output is among the first k.
A task scores the fraction of its test pairs passed; pass@k is the mean over tasks.

In a training run each DDP rank votes on a share of the test pairs (every view of a pair on the
same rank) and the ranks gather only where each pair's true answer placed, never the grids.

With `halt_early`, a row's answer is the one at the first segment whose Q-head says halt, and a
batch stops once every row has halted; the report gives the segments run against the maximum.

    report = evaluate_arc(model, "data/arc1", data_cfg, num_augmentations=8, halt_early=True)
    report["metrics"]["arc/pass_at_2"], report["tasks"]["00576224"]["pass_at_2"]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from urm_ray.data import store
from urm_ray.data.config import DataConfig
from urm_ray.data.tasks import arc
from urm_ray.data.tasks.arc import augment as arc_augment
from urm_ray.errors import ConfigError
from urm_ray.progress import Progress

PASS_KS = (1, 2, 10, 100, 1000)


def exact_match(answers: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[N] bool: each predicted canvas [N, 900] (cropped as the official evaluator does) holds
    exactly the grid of its label canvas [N, 900] (stored form, ignore label = PAD)."""
    got = arc_augment.crop_canonical(answers.detach().cpu().numpy())
    want = arc_augment.canonical(labels.detach().cpu().numpy())
    return torch.from_numpy((got == want).all(axis=1)).to(answers.device)


@dataclass
class Candidate:
    """One distinct predicted grid of a test pair (canonical canvas bytes) and its votes."""

    votes: int = 0
    q_sum: float = 0.0

    @property
    def score(self) -> tuple[int, float]:
        return self.votes, self.q_sum / max(self.votes, 1)


def rank(candidates: dict[bytes, Candidate]) -> list[bytes]:
    """Answers by votes, then mean halting probability; ties keep the order first seen."""
    order = list(candidates)
    return sorted(order, key=lambda h: candidates[h].score, reverse=True)


def vote(answers: Sequence[bytes], q: Sequence[float] | None = None) -> list[bytes]:
    """Ranked distinct answers of one test pair from its predictions (and halting probabilities)."""
    candidates: dict[bytes, Candidate] = {}
    for i, answer in enumerate(answers):
        c = candidates.setdefault(answer, Candidate())
        c.votes += 1
        c.q_sum += 0.0 if q is None else float(q[i])
    return rank(candidates)


def place(ranked: Sequence[bytes], truth: bytes) -> int:
    """Where the true answer is among the ranked answers (0 = first); -1 when it is not there."""
    return ranked.index(truth) if truth in ranked else -1


def pass_at_k(place: int, k: int) -> bool:
    """The true answer, at ``place`` (see ``place``), is among the first k ranked answers."""
    return 0 <= place < k


def task_scores(places: dict[int, int], pairs_of_task: dict[str, list[int]], ks: Sequence[int]
                ) -> dict[str, dict[str, float]]:
    """Per task: pass@k = fraction of its test pairs whose truth is in the top k (a pair without
    predictions fails)."""
    out = {}
    for name, pairs in pairs_of_task.items():
        out[name] = {f"pass_at_{k}": float(np.mean(
            [pass_at_k(places.get(p, -1), k) for p in pairs])) for k in ks}
    return out


@dataclass
class Share:
    """What voting on some of the test pairs gives, without the grids (small, so DDP ranks can
    gather it): where each pair's true answer placed, and the prediction counts."""

    places: dict[int, int] = field(default_factory=dict)  # test pair -> place of its truth
    rows: int = 0  # predictions
    segments_run: float = 0.0  # segments computed, summed over rows (a batch runs until all halt)
    segments_q: float = 0.0  # segments at which each row's answer was taken


def merge(shares: Sequence[Share]) -> Share:
    """The shares of disjoint sets of test pairs as one."""
    out = Share()
    for share in shares:
        out.places.update(share.places)
        out.rows += share.rows
        out.segments_run += share.segments_run
        out.segments_q += share.segments_q
    return out


@dataclass
class _Tally:
    candidates: dict[int, dict[bytes, Candidate]] = field(default_factory=dict)
    share: Share = field(default_factory=Share)

    def add(self, pairs: np.ndarray, answers: np.ndarray, q: np.ndarray) -> None:
        for pair, answer, prob in zip(pairs.tolist(), answers, q.tolist()):
            c = self.candidates.setdefault(pair, {}).setdefault(answer.tobytes(), Candidate())
            c.votes += 1
            c.q_sum += prob

    def placed(self, truths: dict[int, bytes]) -> Share:
        """The share with each voted pair's place of its truth filled in."""
        places = {pair: place(rank(c), truths[pair]) for pair, c in self.candidates.items()}
        return replace(self.share, places=places)


@torch.no_grad()
def predict(model: nn.Module, batch: dict[str, torch.Tensor], halt_early: bool
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Runs ACT segments on a batch. Returns (answers [B, L], halting probability [B], segment
    each answer was taken at [B], segments run). Without `halt_early` answers come from the last
    segment (eval-mode ACT runs to its limit)."""
    carry = model.initial_carry(batch)
    rows = batch["inputs"].shape[0]
    device = batch["inputs"].device
    answers = torch.zeros_like(batch["inputs"])
    prob = torch.zeros(rows, dtype=torch.float64, device=device)
    taken = torch.zeros(rows, dtype=torch.long, device=device)
    segments = 0
    while True:
        carry, outputs = model(carry, batch)
        segments += 1
        q_halt = outputs["q_halt_logits"].double()
        last = bool(carry.halted.all())
        fresh = taken == 0
        take = fresh if last else fresh & (q_halt > 0) if halt_early else torch.zeros_like(fresh)
        predicted = outputs["logits"].argmax(-1).to(answers.dtype)
        answers = torch.where(take[:, None], predicted, answers)
        prob = torch.where(take, torch.sigmoid(q_halt), prob)
        taken = torch.where(take, segments, taken)
        if last or bool((taken > 0).all()):
            return answers, prob, taken, segments


def _views(stored: dict[str, np.ndarray], num_augmentations: int, table: arc.TaskTable
           ) -> np.ndarray:
    """[N] views per stored row: K, or fewer for a task with fewer distinct versions (its aug
    indices from there on repeat versions already seen, which would count their votes twice)."""
    versions = arc_augment.distinct_versions(stored["puzzle_identifiers"], table)
    return np.minimum(num_augmentations, versions)


def _rows(views: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(stored row, aug index) in batches, pair-major: row r with aug indices 0 .. views[r] - 1."""
    rows = np.repeat(np.arange(len(views)), views)
    first = np.repeat(np.cumsum(views) - views, views)  # where each row's views start
    aug = (np.arange(len(rows)) - first).astype(np.int32)
    for start in range(0, len(rows), batch_size):
        yield rows[start:start + batch_size], aug[start:start + batch_size]


def _check(data_cfg: DataConfig, num_augmentations: int, pass_ks: Sequence[int]) -> None:
    slots = data_cfg.num_augmentations if data_cfg.augment else 1
    if not 1 <= num_augmentations <= slots:
        raise ConfigError(
            f"num_augmentations={num_augmentations} must be in [1, {slots}]: the model's puzzle"
            f" table has {slots} augmentation slots per task (data.num_augmentations)")
    if not pass_ks or min(pass_ks) < 1:
        raise ConfigError(f"pass_ks={list(pass_ks)} must be a non-empty list of ints >= 1")


def evaluate_arc(model: nn.Module, data_cfg: DataConfig, split: str = "test",
                 num_augmentations: int = 0, batch_size: int = 256, halt_early: bool = False,
                 pass_ks: Sequence[int] = PASS_KS, max_pairs: int = 0,
                 device: str | torch.device = "cpu", live: bool = False,
                 ranks: tuple[int, int] = (0, 1),
                 gather: Callable[[Share], list[Share]] = lambda share: [share]) -> dict[str, object]:
    """pass@k of `model` (eval mode) on the ARC split by augmentation voting.

    `num_augmentations` (0 = all of data.num_augmentations) versions per test pair, at most the
    task's distinct versions (`arc_augment.distinct_versions`). Returns
    {"metrics": {...}, "tasks": {name: {pass_at_k}}}; metrics are "arc/pass_at_k", "arc/tasks",
    "arc/test_pairs", "arc/predictions", "arc/mean_segments", "arc/compute_saved". Progress over
    the predictions: a bar on stderr when ``live``, else a log line every few seconds.

    ``ranks`` = (rank, world): this process votes on test pairs rank, rank + world, ...; ``gather``
    (a collective, every rank calls it) returns every rank's ``Share`` so each reports all pairs."""
    slots = data_cfg.num_augmentations if data_cfg.augment else 1
    num_augmentations = num_augmentations or slots
    _check(data_cfg, num_augmentations, pass_ks)
    table = arc.load_tasks(data_cfg.path)
    stored = store.read_split(data_cfg.path, split)
    if max_pairs:
        stored = {k: v[:max_pairs] for k, v in stored.items()}
    this_rank, world = ranks
    mine = {k: v[this_rank::world] for k, v in stored.items()}
    tally = _Tally()
    views = _views(mine, num_augmentations, table)
    progress = Progress(f"eval {split}", int(views.sum()), unit="predictions", every_s=5.0,
                        live=live)
    for rows, aug in _rows(views, batch_size):
        ids = mine["puzzle_identifiers"][rows]
        inputs, _, model_ids = arc_augment.augment(
            mine["inputs"][rows], mine["labels"][rows], ids, mine["puzzle_index"][rows],
            aug, data_cfg.shuffle_seed, table, slots, translate_grids=False)
        batch = {"inputs": torch.from_numpy(inputs.astype(np.int32)).to(device),
                 "labels": torch.full(inputs.shape, -100, dtype=torch.long, device=device),
                 "puzzle_identifiers": torch.from_numpy(model_ids).to(device)}
        answers, prob, taken, segments = predict(model, batch, halt_early)
        original = arc_augment.invert(answers.cpu().numpy(), ids, aug, data_cfg.shuffle_seed, table)
        tally.add(mine["puzzle_index"][rows], original, prob.cpu().numpy())
        tally.share.rows += len(rows)
        tally.share.segments_run += segments * len(rows)
        tally.share.segments_q += float(taken.sum())
        progress.update(tally.share.rows)
    progress.finish()
    share = merge(gather(tally.placed(_truths(mine))))
    return _report(share, stored, table, pass_ks, num_augmentations, model.max_segments)


def _truths(stored: dict[str, np.ndarray]) -> dict[int, bytes]:
    """Test pair -> its true output as canonical canvas bytes."""
    return dict(zip(stored["puzzle_index"].tolist(),
                    (c.tobytes() for c in arc_augment.canonical(stored["labels"]))))


def _report(share: Share, stored: dict[str, np.ndarray], table: arc.TaskTable,
            pass_ks: Sequence[int], num_augmentations: int, max_segments: int
            ) -> dict[str, object]:
    pairs_of_task: dict[str, list[int]] = {}
    for pair, ident in zip(stored["puzzle_index"].tolist(), stored["puzzle_identifiers"].tolist()):
        pairs_of_task.setdefault(table.name(ident), []).append(pair)
    tasks = task_scores(share.places, pairs_of_task, pass_ks)
    rows = max(share.rows, 1)
    metrics = {f"arc/pass_at_{k}": float(np.mean([t[f"pass_at_{k}"] for t in tasks.values()]))
               if tasks else 0.0 for k in pass_ks}
    metrics.update({
        "arc/tasks": float(len(tasks)),
        "arc/test_pairs": float(len(stored["puzzle_index"])),
        "arc/augmentations": float(num_augmentations),
        "arc/predictions": float(share.rows),
        "arc/mean_segments_run": share.segments_run / rows,
        "arc/mean_segments_q": share.segments_q / rows,
        "arc/max_segments": float(max_segments),
    })
    if max_segments:
        metrics["arc/compute_saved"] = 1.0 - share.segments_run / rows / max_segments
    return {"metrics": metrics, "tasks": tasks}
