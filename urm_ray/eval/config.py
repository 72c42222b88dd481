"""The ``eval`` section of a run config: when a run evaluates on its held-out split, and what a
trained model spends at test time.

`urm-ray eval` takes the test-time keys as flags (``--width`` is ``eval.width``), an evaluation
sweep searches them, and ``eval.curves`` evaluates under them at each evaluation (``eval.testtime``). On a task that
scores itself by voting over views (ARC's pass@k), ``eval.views`` adds that score at each
evaluation, over ``eval.width`` views.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from urm_ray.data.tasks.task import PuzzleTask
from urm_ray.errors import ConfigError
from urm_ray.models.registry import family

Select = Literal["vote", "q", "confidence", "verifier"]
SELECTIONS: tuple[Select, ...] = ("vote", "q", "confidence", "verifier")


@dataclass(frozen=True)
class EvalConfig:
    """The held-out evaluation during training (cadence, batch, rows, samples), and test-time
    compute: width, depth and noise, and how a puzzle's answer is chosen."""

    every: int = 500  # training steps between evaluations on the held-out split (0 = end only)
    batch_size: int = 512  # rows per evaluation batch; each worker scores a share of the batches
    max_rows: int = 0  # held-out rows scored at each evaluation; 0 = the whole held-out split
    # K sampled trajectories per held-out row, majority-voted, with coverage (distinct valid
    # answers) by the task's verifier: for stochastic models (GRAM), at each evaluation during
    # training. 0 = off. Not eval.width: that one spreads the test-time evaluation below
    samples: int = 0
    # at each evaluation, also the test-time one under this section (width, noise, depth):
    # held-out exact accuracy against depth (segments 1..K) and width (1, 2, 4, ... eval.width),
    # logged as eval/curves/*, with a plot against block-stack passes per puzzle (artifact curves/)
    curves: bool = False
    width: int = 1  # trajectories per puzzle, run as one batch
    # std of the Gaussian noise on the recurrent state after each loop or cycle (model.state_noise)
    # that makes the trajectories differ; GRAM's differ through its prior and take none
    noise: float = 0.0
    # trajectory i sees the task's augmentation i of the puzzle (0: the puzzle itself: digits
    # relabelled, rows and columns shuffled, the board turned) and its answers are mapped back
    # before the selection: trajectories that differ through the task's symmetries. ARC: each
    # evaluation also reports arc/pass_at_k, voted over eval.width versions of each test input
    views: bool = False
    # a puzzle's answer among its trajectories: majority vote, the highest Q-halt score, the answer
    # the model finds most likely (mean log-probability of its tokens), or the first the task's
    # verifier accepts (an oracle the others lack: reported apart, as oracle_*)
    select: Select = "vote"
    segments: int = 0  # ACT segments (depth), more than trained if asked; 0 = model.max_segments
    loops: int = 0  # block-stack passes per segment (URM-like families); 0 = model.loops
    halt_early: bool = False  # each trajectory answers where its Q-head first says halt
    seed: int = 0  # seeds the noise: the same seed gives the same answers

    def __post_init__(self) -> None:
        for key in ("every", "max_rows", "samples"):
            if getattr(self, key) < 0:
                raise ConfigError(f"eval.{key}={getattr(self, key)} must be >= 0")
        if self.batch_size < 1:
            raise ConfigError(f"eval.batch_size={self.batch_size} must be >= 1")
        if self.width < 1:
            raise ConfigError(f"eval.width={self.width} must be >= 1")
        if self.noise < 0:
            raise ConfigError(f"eval.noise={self.noise} must be >= 0")
        if self.select not in SELECTIONS:
            raise ConfigError(f"eval.select={self.select!r} must be one of {', '.join(SELECTIONS)}")
        for key in ("segments", "loops"):
            if getattr(self, key) < 0:
                raise ConfigError(f"eval.{key}={getattr(self, key)} must be >= 1 (0 = as trained)")

    def check_task(self, task: PuzzleTask) -> None:
        """ConfigError where the dataset's task cannot take these settings in a test-time evaluation:
        views of a task with no augmentation, or of one that votes over its views in its own score."""
        if self.views and task.scoring is not None:
            raise ConfigError(f"eval.views=true: the {task.name} task votes over its views in its own score "
                              f"({task.scoring.prefix}*), not in the test-time evaluation (eval.curves, "
                              "test-time settings); set eval.views=false there")
        if self.views and task.augment is None:
            raise ConfigError(f"eval.views=true: the {task.name} task has no augmentation to draw views from "
                              "(sudoku, maze and coloring have one); spread the trajectories with eval.noise "
                              "(GRAM: its prior)")

    def own_views(self, task: PuzzleTask, slots: int) -> int:
        """Views of each held-out input the task's own score votes over at each evaluation: 0
        without eval.views or on a task scored on one view; ConfigError beyond the ``slots``
        versions per task that the puzzle table holds."""
        if not self.views or task.scoring is None:
            return 0
        if self.width > slots:
            raise ConfigError(
                f"eval.width={self.width} with eval.views=true must be <= {slots} on {task.name} data: the "
                "puzzle table has data.num_augmentations augmentation slots per task (1 without data.augment)")
        return self.width

    def check_model(self, model: Any) -> None:
        """ConfigError where the model config cannot take these settings: noise on GRAM (it samples
        from its prior), loops on a family without loops, no more loops than its truncation."""
        spec = family(model.name)
        if self.noise and not spec.state_noise:
            raise ConfigError(f"eval.noise={self.noise}: {model.name} draws its trajectories from its prior "
                              "(model.sample_temperature); leave it at 0")
        if self.loops and not spec.has_loops:
            raise ConfigError(f"eval.loops={self.loops}: {model.name} has no loops (URM-like families do); "
                              "eval.segments sets its depth")
        if self.loops and self.loops <= model.truncation:
            raise ConfigError(f"eval.loops={self.loops} must exceed model.truncation={model.truncation}")
