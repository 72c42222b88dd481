"""ARC's registry entry: the pieces the rest of urm_ray asks the task for.

Each augmented version of a whole task is its own puzzle (`Versions`): it has its own
puzzle-embedding row, versions are drawn per task without repeats and grids translate on the
canvas (`augment`); held-out evaluation votes over versions and reports pass@k under ``arc/``
(`Scoring`, `evaluate`) instead of scoring one view.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from urm_ray.data.config import DataConfig
from urm_ray.data.tasks import arc
from urm_ray.data.tasks.arc import augment
from urm_ray.data.tasks.task import PuzzleTask, Scoring, Versions

if TYPE_CHECKING:  # scoring loads torch when it runs: the stream's map tasks import this entry
    from torch import nn

logger = logging.getLogger("urm_ray.data")


def prepare(path: str, num_augmentations: int) -> arc.TaskTable:
    """The dataset's task table, arrays only (what the stream's map tasks need); logs the tasks
    whose K aug indices must repeat versions. Logged here, not stored with the dataset: the count
    depends on K, which the run chooses (data.num_augmentations)."""
    table = arc.load_tasks(path)
    few = augment.few_versions(table, num_augmentations)
    if few:
        by_count = sorted(few.items(), key=lambda item: item[1])
        fewest = ", ".join(f"{name} ({n})" for name, n in by_count[:5])
        logger.info("arc: %d of %d tasks have fewer distinct augmented versions than"
                    " data.num_augmentations=%d and repeat them in order; fewest: %s",
                    len(few), len(table.records), num_augmentations, fewest)
    return dataclasses.replace(table, records=[])


def table_rows(num_identifiers: int, slots: int) -> int:
    """Blank row 0, then one row per task version, as the official builder numbers them."""
    return 1 + (num_identifiers - 1) * slots


def score(model: nn.Module, data_cfg: DataConfig, split: str, *, views: int, max_rows: int = 0,
          ranks: tuple[int, int] = (0, 1), gather: Any = None, **voting: Any) -> dict[str, Any]:
    """pass@k by voting over ``views`` versions of each held-out test pair (`evaluate.evaluate_arc`);
    ``voting``: the other fields of `evaluate.Voting`."""
    from urm_ray.data.tasks.arc import evaluate

    shares = evaluate.Shares(*ranks, gather) if gather is not None else evaluate.Shares(*ranks)
    return evaluate.evaluate_arc(model, data_cfg, split, evaluate.Voting(views=views, max_pairs=max_rows, **voting),
                                 shares)


# one right answer per input (no label-free verifier); augmented per task version, voted pass@k
TASK = PuzzleTask(
    arc.NAME, add_builder=arc.add_builder, augmentation=arc.AUGMENTATION,
    versions=Versions(prepare=prepare, augment=augment.augment, identifiers=augment.identifiers_for,
                      table_rows=table_rows, translates=True),
    scoring=Scoring(prefix="arc/", score=score, pass_ks=arc.PASS_KS),
)
