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

    report = evaluate_arc(model, data_cfg, "test", Voting(views=8, halt_early=True))
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
from urm_ray.metrics import Candidate, pass_at_k, place, rank
from urm_ray.progress import Progress



@dataclass(frozen=True)
class Voting:
    """How a split is voted on: views per test pair, rows per forward, which answer a row gives."""

    views: int = 0  # versions per test pair (0 = all data.num_augmentations)
    batch_size: int = 256  # predictions per forward
    halt_early: bool = False  # a row answers at the first segment its Q-head says halt
    pass_ks: Sequence[int] = arc.PASS_KS
    max_pairs: int = 0  # the first test pairs only (0 = all)
    device: str | torch.device = "cpu"
    live: bool = False  # progress as a bar on stderr, else a log line every few seconds


@dataclass(frozen=True)
class Shares:
    """This process among the DDP ranks that vote on a split: it votes on test pairs rank,
    rank + world, ...; ``gather`` (a collective every rank calls) returns every rank's ``Share``."""

    rank: int = 0
    world: int = 1
    gather: Callable[[Share], list[Share]] = lambda share: [share]


def exact_match(answers: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[N] bool: each predicted canvas [N, 900] (cropped as the official evaluator does) holds
    exactly the grid of its label canvas [N, 900] (stored form, ignore label = PAD)."""
    got = arc_augment.crop_canonical(answers.detach().cpu().numpy())
    want = arc_augment.canonical(labels.detach().cpu().numpy())
    return torch.from_numpy((got == want).all(axis=1)).to(answers.device)


def task_scores(places: dict[int, int], pairs_of_task: dict[str, list[int]], ks: Sequence[int]
                ) -> dict[str, dict[str, float]]:
    """Per task: pass@k = fraction of its test pairs whose truth is in the top k (a pair without
    predictions fails)."""
    return {name: {f"pass_at_{k}": float(np.mean([pass_at_k(places.get(p, -1), k) for p in pairs]))
                   for k in ks}
            for name, pairs in pairs_of_task.items()}


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

    def count(self, rows: int, segments: int, taken: torch.Tensor) -> None:
        """One batch of ``rows`` predictions that ran ``segments`` segments, answered at ``taken``."""
        self.share.rows += rows
        self.share.segments_run += segments * rows
        self.share.segments_q += float(taken.sum())

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


def _slots(data_cfg: DataConfig) -> int:
    """Augmentation slots per task in the model's puzzle table."""
    return data_cfg.num_augmentations if data_cfg.augment else 1


def _checked(data_cfg: DataConfig, voting: Voting) -> Voting:
    """``voting`` with its views resolved (0 = all slots); ConfigError for views beyond the
    model's slots or a pass@k with k < 1."""
    slots = _slots(data_cfg)
    views = voting.views or slots
    if not 1 <= views <= slots:
        raise ConfigError(
            f"num_augmentations={views} must be in [1, {slots}]: the model's puzzle"
            f" table has {slots} augmentation slots per task (data.num_augmentations)")
    if not voting.pass_ks or min(voting.pass_ks) < 1:
        raise ConfigError(f"pass_ks={list(voting.pass_ks)} must be a non-empty list of ints >= 1")
    return replace(voting, views=views)


def _batch(mine: dict[str, np.ndarray], rows: np.ndarray, aug: np.ndarray, data_cfg: DataConfig,
           table: arc.TaskTable, device: str | torch.device) -> dict[str, torch.Tensor]:
    """The model's batch of stored ``rows`` in their versions ``aug`` (no translation, no labels)."""
    picked = {key: column[rows] for key, column in mine.items()}
    inputs, _, model_ids = arc_augment.augment(picked, aug, data_cfg.shuffle_seed, table,
                                               _slots(data_cfg), translate_grids=False)
    return {"inputs": torch.from_numpy(inputs.astype(np.int32)).to(device),
            "labels": torch.full(inputs.shape, -100, dtype=torch.long, device=device),
            "puzzle_identifiers": torch.from_numpy(model_ids).to(device)}


def _vote(model: nn.Module, mine: dict[str, np.ndarray], data_cfg: DataConfig, table: arc.TaskTable,
          voting: Voting, progress: Progress) -> _Tally:
    """Every view of this process's test pairs predicted, mapped back and counted as a vote."""
    tally = _Tally()
    for rows, aug in _rows(_views(mine, voting.views, table), voting.batch_size):
        batch = _batch(mine, rows, aug, data_cfg, table, voting.device)
        answers, prob, taken, segments = predict(model, batch, voting.halt_early)
        original = arc_augment.invert(answers.cpu().numpy(), mine["puzzle_identifiers"][rows], aug,
                                      data_cfg.shuffle_seed, table)
        tally.add(mine["puzzle_index"][rows], original, prob.cpu().numpy())
        tally.count(len(rows), segments, taken)
        progress.update(tally.share.rows)
    return tally


def evaluate_arc(model: nn.Module, data_cfg: DataConfig, split: str = "test", voting: Voting = Voting(),
                 shares: Shares = Shares()) -> dict[str, object]:
    """pass@k of `model` (eval mode) on the ARC split by augmentation voting.

    ``voting.views`` versions per test pair, at most the task's distinct versions
    (`arc_augment.distinct_versions`). Returns {"metrics": {...}, "tasks": {name: {pass_at_k}}};
    metrics are "arc/pass_at_k", "arc/tasks", "arc/test_pairs", "arc/predictions",
    "arc/mean_segments", "arc/compute_saved". Each rank of ``shares`` votes on its share of the
    test pairs; every rank reports all of them."""
    voting = _checked(data_cfg, voting)
    table = arc.load_tasks(data_cfg.path)
    stored = store.read_split(data_cfg.path, split)
    if voting.max_pairs:
        stored = {k: v[:voting.max_pairs] for k, v in stored.items()}
    mine = {k: v[shares.rank::shares.world] for k, v in stored.items()}
    progress = Progress(f"eval {split}", int(_views(mine, voting.views, table).sum()), unit="predictions",
                        every_s=5.0, live=voting.live)
    tally = _vote(model, mine, data_cfg, table, voting, progress)
    progress.finish()
    share = merge(shares.gather(tally.placed(_truths(mine))))
    return _report(share, stored, table, voting, model.max_segments)


def _truths(stored: dict[str, np.ndarray]) -> dict[int, bytes]:
    """Test pair -> its true output as canonical canvas bytes."""
    return dict(zip(stored["puzzle_index"].tolist(),
                    (c.tobytes() for c in arc_augment.canonical(stored["labels"]))))


def _report(share: Share, stored: dict[str, np.ndarray], table: arc.TaskTable, voting: Voting,
            max_segments: int) -> dict[str, object]:
    pairs_of_task: dict[str, list[int]] = {}
    for pair, ident in zip(stored["puzzle_index"].tolist(), stored["puzzle_identifiers"].tolist()):
        pairs_of_task.setdefault(table.name(ident), []).append(pair)
    tasks = task_scores(share.places, pairs_of_task, voting.pass_ks)
    rows = max(share.rows, 1)
    metrics = {f"arc/pass_at_{k}": float(np.mean([t[f"pass_at_{k}"] for t in tasks.values()]))
               if tasks else 0.0 for k in voting.pass_ks}
    metrics.update({
        "arc/tasks": float(len(tasks)),
        "arc/test_pairs": float(len(stored["puzzle_index"])),
        "arc/augmentations": float(voting.views),
        "arc/predictions": float(share.rows),
        "arc/mean_segments_run": share.segments_run / rows,
        "arc/mean_segments_q": share.segments_q / rows,
        "arc/max_segments": float(max_segments),
    })
    if max_segments:
        metrics["arc/compute_saved"] = 1.0 - share.segments_run / rows / max_segments
    return {"metrics": metrics, "tasks": tasks}
