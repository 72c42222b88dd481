"""Test-time compute of a trained model: width, depth and noise at evaluation, without retraining.

    settings = EvalConfig(width=16, noise=0.1, select="q", segments=24)   # the eval section
    with applied(model, settings):                       # the model runs with depth, loops and noise
        sums = evaluate_testtime(model, batch, settings, verifier)

Width N runs N trajectories per puzzle as one batch of N * B rows (trajectory-major, as GRAM's
prior samples). They differ where the model draws noise: ``model.state_noise`` (Gaussian noise on
the recurrent state after each loop or cycle, any family but GRAM) or GRAM's own prior; or where
they see the puzzle: with ``views`` trajectory i reads the task's augmentation i of it (0: the
puzzle itself) and its answers are mapped back onto the puzzle before any selection. Depth
runs ``segments`` ACT segments (more than the model trained with, if asked) and, for the families
with loops, ``loops`` block-stack passes per segment.

Each puzzle's answer is chosen among its N trajectories:

- ``vote``: the most frequent answer (ties to the earliest trajectory);
- ``q``: the trajectory whose Q-head scores halting highest where it answered;
- ``confidence``: the trajectory whose decoded answer the model itself finds most likely (the
  mean over positions of the log-probability of each decoded token);
- ``verifier``: the first trajectory whose answer the task's verifier accepts (the label where a
  task has no verifier). That uses an oracle the others lack, so it is always reported apart
  (``oracle_exact``), never as ``exact``.

Compute is counted in block-stack passes per puzzle: trajectories x segments run x the family's
``stack_passes`` per segment. With ``halt_early`` a trajectory answers at the first segment its
Q-head says halt and counts only the segments up to there.

The sums also hold two curves from the same rollout: exact accuracy (by ``select``; vote for the
verifier) against depth, at each segment 1..K, and against width, over the first 1, 2, 4, ... N
trajectories. Width 1 with noise 0 is the plain evaluation, bit for bit.

Every accuracy also comes as validity, the chosen answer accepted by the task's verifier
(``*_valid``): where an input has many answers (N-Queens, graph colouring, the blank Sudoku) a
valid answer is a solved puzzle and the label is just one of them. Without a verifier, valid is
exact.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn

from urm_ray.data.augment import Transform, TransformFn, row_transforms
from urm_ray.eval.config import EvalConfig, Select
from urm_ray.eval.heldout import Verifier
from urm_ray.eval.voting import majority_vote
from urm_ray.metrics import exact
from urm_ray.models.family import TestTime
from urm_ray.models.registry import family_of

PREFIX = "eval/testtime/"  # the MLflow names of a checkpoint's test-time evaluation


def widths(width: int) -> list[int]:
    """The width curve's points: 1, 2, 4, ... below ``width``, then ``width``."""
    points = [1]
    while points[-1] * 2 < width:
        points.append(points[-1] * 2)
    return points if width == 1 else [*points, width]


@contextmanager
def applied(model: nn.Module, settings: EvalConfig) -> Iterator[nn.Module]:
    """``model`` running with the settings' depth, loops and noise (its family's
    ``FamilySpec.running_with``: the model's config object is never written); on exit it holds
    exactly what it held before. ConfigError where the model cannot take them
    (``EvalConfig.check_model``)."""
    settings.check_model(model.config)
    at = TestTime(segments=settings.segments, loops=settings.loops, noise=settings.noise)
    with family_of(model).running_with(model, at) as running:
        yield running


@dataclass(frozen=True)
class Views:
    """Which view of its puzzle each of the N * B rows of a rollout reads: row n * B + b is
    trajectory n of puzzle b, on the task's augmentation n of it (0: the puzzle itself)."""

    rows: np.ndarray  # the augmented rows (trajectories 1..N-1)
    transform: Optional[Transform]  # theirs; None when there are none (width 1)

    @classmethod
    def of(cls, augment: TransformFn, batch: dict[str, Tensor], width: int, seed: int) -> Views:
        """The views of ``batch``'s puzzles for ``width`` trajectories, drawn under ``seed``."""
        rows = batch["inputs"].shape[0]
        index = batch["puzzle_index"].cpu().numpy() if "puzzle_index" in batch else np.arange(rows)
        inputs, labels = (batch[k].cpu().numpy() for k in ("inputs", "labels"))
        view = np.repeat(np.arange(width), rows)
        return cls(*row_transforms(augment, np.tile(inputs, (width, 1)), np.tile(labels, (width, 1)),
                                   np.tile(index, width), view, seed))

    def _mapped(self, rows: Tensor, forward: bool) -> Tensor:
        if self.transform is None:
            return rows
        out = rows.cpu().numpy().copy()
        out[self.rows] = (self.transform.apply if forward else self.transform.invert)(out[self.rows])
        return torch.as_tensor(out).to(rows.device, rows.dtype)

    def apply(self, repeated: dict[str, Tensor]) -> dict[str, Tensor]:
        """The repeated batch with each trajectory's inputs and labels in its view."""
        return {**repeated, **{k: self._mapped(repeated[k], True) for k in ("inputs", "labels")}}

    def invert(self, answers: Tensor) -> Tensor:
        """[N * B, L] answers in the views -> the same answers on the puzzles themselves."""
        return self._mapped(answers, False)


@dataclass
class Rollout:
    """N trajectories of B puzzles through K segments."""

    answers: Tensor  # [K, N, B, L]: each trajectory's decoded answer after each segment
    q_halt: Tensor  # [K, N, B]: its Q-halt logit after each segment
    confidence: Tensor  # [K, N, B]: mean log-probability of its decoded tokens after each segment
    halts_at: Tensor  # [N, B]: the segment (1..K) where it answers with halt_early, else K


@torch.no_grad()
def rollout(model: nn.Module, batch: dict[str, Tensor], width: int, halt_early: bool,
            views: Optional[Views] = None) -> Rollout:
    """Run ``width`` trajectories of every row of ``batch`` through all of the model's segments
    (eval mode: an ACT model halts only at its segment limit, so no segment asks the device
    whether to go on), each on its view where ``views`` are given (answers mapped back onto the
    puzzles)."""
    if model.training:
        raise ValueError("rollout needs model.eval()")
    repeated = {k: v.repeat(width, *([1] * (v.ndim - 1))) for k, v in batch.items()}
    if views is not None:
        repeated = views.apply(repeated)
    carry = model.initial_carry(repeated)
    answers, q_halt, confidence = [], [], []
    for _ in range(model.max_segments):
        carry, outputs = model(carry, repeated)
        decoded = outputs["logits"].argmax(-1)  # [N * B, L]
        log_probs = outputs["logits"].float().log_softmax(-1)  # [N * B, L, V]
        confidence.append(log_probs.gather(-1, decoded.unsqueeze(-1)).mean((-2, -1)).view(width, -1))
        if views is not None:
            decoded = views.invert(decoded)
        answers.append(decoded.view(width, *batch["labels"].shape))
        q_halt.append(outputs["q_halt_logits"].float().view(width, -1))
    q = torch.stack(q_halt)  # [K, N, B]
    segments = len(answers)
    halts_at = torch.full(q.shape[1:], segments, dtype=torch.long, device=q.device)
    if halt_early:
        said = q > 0  # [K, N, B]
        first = said.int().argmax(0) + 1  # the first segment that says halt (1-based)
        halts_at = torch.where(said.any(0), first, halts_at)
    return Rollout(torch.stack(answers), q, torch.stack(confidence), halts_at)


@dataclass
class Answered:
    """Each trajectory where it answers: its answer and the scores the selections rank it by."""

    answers: Tensor  # [N, B, L]
    q_halt: Tensor  # [N, B]
    confidence: Tensor  # [N, B]

    def head(self, n: int) -> Answered:
        """The first ``n`` trajectories (a point of the width curve)."""
        return Answered(self.answers[:n], self.q_halt[:n], self.confidence[:n])


def answered(roll: Rollout) -> Answered:
    """Each trajectory at the segment where it answers."""
    index = (roll.halts_at - 1).unsqueeze(0)  # [1, N, B]
    answers = roll.answers.gather(0, index.unsqueeze(-1).expand(1, *roll.answers.shape[1:])).squeeze(0)
    return Answered(answers, roll.q_halt.gather(0, index).squeeze(0),
                    roll.confidence.gather(0, index).squeeze(0))


def at_segment(roll: Rollout, k: int) -> Answered:
    """Every trajectory after segment ``k`` (0-based: a point of the depth curve)."""
    return Answered(roll.answers[k], roll.q_halt[k], roll.confidence[k])


def pick(answers: Tensor, index: Tensor) -> Tensor:
    """answers [N, B, L] -> [B, L]: trajectory ``index[b]`` of each row."""
    return answers.gather(0, index.view(1, -1, 1).expand(1, *answers.shape[1:])).squeeze(0)


def select_best(answers: Tensor, score: Tensor) -> Tensor:
    """The answer of the trajectory with the highest score (Q-halt, confidence), per row
    ([N, B, L], [N, B])."""
    return pick(answers, score.argmax(0))


def select_accepted(answers: Tensor, accepted: Tensor) -> Tensor:
    """The first accepted trajectory's answer per row (trajectory 0's where none is)."""
    return pick(answers, accepted.int().argmax(0))


def choose(candidates: Answered, how: Select) -> Tensor:
    """A row's answer among its trajectories, by vote, Q or confidence (``verifier`` goes
    through ``select_accepted``)."""
    if how == "q":
        return select_best(candidates.answers, candidates.q_halt)
    if how == "confidence":
        return select_best(candidates.answers, candidates.confidence)
    return majority_vote(candidates.answers)


@torch.no_grad()
def evaluate_testtime(model: nn.Module, batch: dict[str, Tensor], settings: EvalConfig,
                      verifier: Optional[Verifier] = None,
                      augment: Optional[TransformFn] = None) -> dict[str, Tensor]:
    """Per-metric sums (float64 scalars) of one batch under ``settings`` (already ``applied``):
    ``exact`` by the settings' selection (verifier selection puts the oracle's here too),
    ``vote_exact``, ``q_exact``, ``confidence_exact``, ``oracle_exact`` (the first trajectory the
    verifier accepts), ``valid`` (the selected answer accepted by the verifier) and ``vote_valid``
    ... ``oracle_valid`` alike, block-stack ``passes``, ``seconds`` of wall time, and the curves:
    ``depth@k`` (exact at segment k), ``width@w``, and ``depth_valid@k``, ``width_valid@w``.
    ``augment`` is the task's augmentation, which ``settings.views`` draws the views from."""
    start = time.perf_counter()
    views = None
    if settings.views:
        if augment is None:
            raise ValueError("settings.views needs the task's augmentation (EvalConfig.check_task)")
        views = Views.of(augment, batch, settings.width, settings.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        roll = rollout(model, batch, settings.width, settings.halt_early, views)
    labels, inputs = batch["labels"], batch["inputs"]
    final = answered(roll)

    def accepts(candidates: Tensor) -> Tensor:  # [n, B, L] -> [n, B]
        if verifier is None:
            return exact(candidates, labels)
        n = candidates.shape[0]
        judged = verifier(candidates.flatten(0, 1), inputs.repeat(n, 1), labels.repeat(n, 1))
        return judged.to(labels.device, torch.bool).view(n, -1)

    def valid(answer: Tensor) -> Tensor:  # [B, L] -> how many the verifier accepts
        return accepts(answer.unsqueeze(0))[0].sum()

    oracle = select_accepted(final.answers, accepts(final.answers))
    by: dict[str, Tensor] = {how: choose(final, how) for how in ("vote", "q", "confidence")}
    chosen = oracle if settings.select == "verifier" else by[settings.select]
    how: Select = "vote" if settings.select == "verifier" else settings.select
    sums = {
        "rows": labels.shape[0], "exact": exact(chosen, labels).sum(), "valid": valid(chosen),
        **{f"{name}_exact": exact(answer, labels).sum() for name, answer in by.items()},
        **{f"{name}_valid": valid(answer) for name, answer in by.items()},
        "oracle_exact": exact(oracle, labels).sum(), "oracle_valid": valid(oracle),
        "passes": roll.halts_at.sum() * model.stack_passes,
    }
    for k in range(roll.answers.shape[0]):
        answer = choose(at_segment(roll, k), how)
        sums[f"depth@{k + 1}"], sums[f"depth_valid@{k + 1}"] = exact(answer, labels).sum(), valid(answer)
    for w in widths(settings.width):
        answer = choose(final.head(w), how)
        sums[f"width@{w}"], sums[f"width_valid@{w}"] = exact(answer, labels).sum(), valid(answer)
    sums["seconds"] = time.perf_counter() - start
    return {k: torch.as_tensor(v, dtype=torch.float64) for k, v in sums.items()}


def accumulate(batches: Iterable[dict[str, Tensor]], model: nn.Module, settings: EvalConfig,
               verifier: Optional[Verifier] = None, augment: Optional[TransformFn] = None) -> dict[str, Tensor]:
    """``evaluate_testtime``'s sums over batches."""
    totals: dict[str, Tensor] = {}
    for batch in batches:
        for key, value in evaluate_testtime(model, batch, settings, verifier, augment).items():
            totals[key] = totals.get(key, 0) + value
    return totals


def summarize(sums: dict[str, Tensor], settings: EvalConfig) -> dict[str, object]:
    """The report of summed counts: accuracies, passes and seconds per puzzle, the curves."""
    rows = max(float(sums["rows"]), 1.0)
    out: dict[str, object] = {
        "width": settings.width, "noise": settings.noise, "views": settings.views, "select": settings.select,
        "segments": sum(1 for k in sums if k.startswith("depth@")), "halt_early": settings.halt_early,
        "seed": settings.seed, "rows": int(sums["rows"]),
        "exact_accuracy": float(sums["exact"]) / rows,
        "vote_exact_accuracy": float(sums["vote_exact"]) / rows,
        "q_exact_accuracy": float(sums["q_exact"]) / rows,
        "confidence_exact_accuracy": float(sums["confidence_exact"]) / rows,
        "oracle_exact_accuracy": float(sums["oracle_exact"]) / rows,  # uses the verifier: apart
        "valid_accuracy": float(sums["valid"]) / rows,
        **{f"{name}_valid_accuracy": float(sums[f"{name}_valid"]) / rows for name in ("vote", "q", "confidence", "oracle")},
        "passes_per_puzzle": float(sums["passes"]) / rows,
        "seconds_per_puzzle": float(sums["seconds"]) / rows,
    }
    for curve in ("depth", "width", "depth_valid", "width_valid"):
        out[f"{curve}_curve"] = {int(k.split("@")[1]): float(v) / rows
                                 for k, v in sums.items() if k.startswith(f"{curve}@")}
    return out


def _curve(report: dict[str, object], name: str) -> dict[int, float]:
    """A curve of the report, keyed by int (a report read back from JSON has str keys)."""
    return {int(k): float(v) for k, v in report[name].items()}


def curve_metrics(report: dict[str, object], prefix: str = PREFIX) -> list[tuple[dict[str, float], int]]:
    """The curves as MLflow metric histories, (metrics, step) pairs: ``depth_exact`` and
    ``depth_valid`` at step k (segments), ``width_exact`` and ``width_valid`` at step w
    (trajectories), and ``depth_passes`` (passes per puzzle at depth k: k x passes per segment x
    width)."""
    depth, width = _curve(report, "depth_curve"), _curve(report, "width_curve")
    depth_valid, width_valid = _curve(report, "depth_valid_curve"), _curve(report, "width_valid_curve")
    per_segment = float(report["passes_per_puzzle"]) / max(int(report["segments"]), 1)
    points = [({f"{prefix}depth_exact": acc, f"{prefix}depth_valid": depth_valid[k],
                f"{prefix}depth_passes": per_segment * k}, k) for k, acc in depth.items()]
    return points + [({f"{prefix}width_exact": acc, f"{prefix}width_valid": width_valid[w]}, w)
                     for w, acc in width.items()]


def plot_curves(report: dict[str, object], path: str, title: str = "") -> str:
    """Exact accuracy against block-stack passes per puzzle, over depth and over width, as a PNG;
    validity too where it differs from exact (inputs with many answers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    segments, width = int(report["segments"]), int(report["width"])
    per_pass = float(report["passes_per_puzzle"]) / max(segments * width, 1)  # passes of one segment
    figure, axis = plt.subplots(figsize=(6, 4))
    measures = ["exact", "valid"] if any(
        _curve(report, f"{along}_curve") != _curve(report, f"{along}_valid_curve") for along in ("depth", "width")
    ) else ["exact"]
    for measure in measures:
        suffix = "" if measure == "exact" else "_valid"
        depth = _curve(report, f"depth{suffix}_curve")
        axis.plot([per_pass * width * k for k in depth], list(depth.values()), "o-" if not suffix else "o:",
                  label=f"{measure}, depth: segments 1..{segments} at width {width}")
        wide = _curve(report, f"width{suffix}_curve")
        axis.plot([per_pass * segments * w for w in wide], list(wide.values()), "s--" if not suffix else "s:",
                  label=f"{measure}, width: 1..{width} trajectories at {segments} segments")
    axis.set_xscale("log")
    axis.set_xlabel("block-stack passes per puzzle")
    axis.set_ylabel(f"{' / '.join(measures)} accuracy ({report['select']})")
    axis.set_ylim(-0.02, 1.02)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title(title or f"noise {report['noise']}" + (", views" if report.get("views") else ""), fontsize=9)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path


# the report's numbers (the rest describes the settings and holds the curves)
SCALARS = ("exact_accuracy", "vote_exact_accuracy", "q_exact_accuracy", "confidence_exact_accuracy",
           "oracle_exact_accuracy", "valid_accuracy", "vote_valid_accuracy", "q_valid_accuracy",
           "confidence_valid_accuracy", "oracle_valid_accuracy", "passes_per_puzzle", "seconds_per_puzzle")


def scalar_metrics(report: dict[str, object], prefix: str = PREFIX) -> dict[str, float]:
    """The report's numbers (accuracies, passes, seconds) as MLflow metrics."""
    return {f"{prefix}{key}": float(report[key]) for key in SCALARS}
