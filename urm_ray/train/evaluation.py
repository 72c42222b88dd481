"""What a run evaluates at each evaluation step, on whichever rank and host the loop runs.

    evaluation = InRun.for_run(cfg, meta)
    metrics = evaluation.run(model, batches, ranks, step, log_plot)   # model in eval mode, EMA weights

- the plain held-out metrics (``heldout``), judged by the task's verifier;
- with ``eval.samples``: GRAM's sampled trajectories, voted, with coverage;
- with ``eval.views``, the task's own score where it has one (``PuzzleTask.scoring``): ARC's
  pass@k by voting over ``eval.width`` augmented views of each test input;
- with ``eval.curves``: the test-time evaluation under the ``eval`` section (``testtime``),
  accuracy against depth and width, and its plot.

Sums are combined across ranks by ``ranks.reduce`` (an all-reduce) before dividing, and ARC's
per-pair results by ``ranks.gather``; both are collectives every rank calls.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from urm_ray.config import RunConfig
from urm_ray.data import originals
from urm_ray.data.augment import TransformFn
from urm_ray.data.store import DatasetMeta
from urm_ray.data.tasks import registry
from urm_ray.data.tasks.task import Scoring
from urm_ray.data.tasks.verify import optional_verifier
from urm_ray.eval import testtime
from urm_ray.eval.heldout import Verifier, held_out_metrics

Batches = Callable[[int], Iterator[dict[str, torch.Tensor]]]  # rows per batch -> this rank's batches


@dataclass(frozen=True)
class Ranks:
    """This rank among the run's workers, and the collectives that combine their results."""

    rank: int
    world: int
    device: torch.device
    reduce: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
    gather: Callable[[Any], list[Any]]


@dataclass(frozen=True)
class InRun:
    """A run's evaluation: its config, the task's verifier and whether the task scores itself."""

    cfg: RunConfig
    meta: DatasetMeta
    verifier: Optional[Verifier]
    scoring: Optional[Scoring]  # the task's own score (None: the task has none, or eval.views is off)
    own_views: int  # augmented views that score votes over per test input
    augment: Optional[TransformFn]  # the task's augmentation: the curves' views (eval.views)

    @classmethod
    def for_run(cls, cfg: RunConfig, meta: DatasetMeta) -> InRun:
        task = registry.of(meta)
        views = cfg.eval.own_views(task, cfg.data.augmentation_slots())
        return cls(cfg, meta, optional_verifier(meta.task, meta.seq_len), task.scoring if views else None,
                   views, task.augment)

    @cached_property
    def heldout(self) -> dict[str, np.ndarray]:
        """The held-out originals that every evaluation of the run scores, read at the first one."""
        return originals.read_originals(self.cfg.data, self.meta, self.cfg.eval.max_rows)

    def run(self, model: nn.Module, batches: Batches, ranks: Ranks, step: int,
            log_plot: Callable[[Path], None]) -> dict[str, float]:
        """The metrics of one evaluation at training ``step``; rank 0 hands the curves' plot to
        ``log_plot`` (a file that lasts for the call)."""
        settings = self.cfg.eval
        metrics = held_out_metrics(model, lambda: batches(settings.batch_size), settings.samples,
                                   self.verifier, reduce=ranks.reduce)
        if self.scoring is not None:
            metrics.update(self.own_metrics(model, ranks))
        if settings.curves:
            curves, report = self.curves(model, batches, ranks)
            metrics.update(curves)
            if ranks.rank == 0:
                with tempfile.TemporaryDirectory() as folder:
                    log_plot(Path(testtime.plot_curves(report, f"{folder}/step-{step:07d}.png", f"step {step}")))
        return metrics

    def own_metrics(self, model: nn.Module, ranks: Ranks) -> dict[str, float]:
        """``urm-ray eval``'s vote of the task's own score over ``own_views`` views of each held-out
        test input, with pass@k for k up to the views (pass@1 and pass@2 always); each rank votes
        on a share of the test pairs."""
        assert self.scoring is not None
        views, settings = self.own_views, self.cfg.eval
        report = self.scoring.score(
            model, self.cfg.data, self.cfg.data.eval_split, views=views, batch_size=settings.batch_size,
            pass_ks=tuple(k for k in self.scoring.pass_ks if k <= max(views, 2)), max_rows=settings.max_rows,
            device=ranks.device, ranks=(ranks.rank, ranks.world), gather=ranks.gather)
        return report["metrics"]

    def curves(self, model: nn.Module, batches: Batches, ranks: Ranks) -> tuple[dict[str, float], dict[str, Any]]:
        """Held-out exact and valid accuracy against depth and width under the ``eval`` section, as
        metrics ``eval/curves/*``, and the report they come from."""
        settings = self.cfg.eval
        rows = max(1, self.cfg.eval.batch_size // settings.width)  # rows x width per forward
        with testtime.applied(model, settings):
            sums = ranks.reduce(testtime.accumulate(batches(rows), model, settings, self.verifier, self.augment))
        report = testtime.summarize(sums, settings)
        out = {f"eval/curves/{curve}_{k}": acc for curve in ("depth", "width", "depth_valid", "width_valid")
               for k, acc in report[f"{curve}_curve"].items()}
        return {**out, "eval/curves/passes_per_puzzle": report["passes_per_puzzle"]}, report
