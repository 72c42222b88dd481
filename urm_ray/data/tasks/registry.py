"""The task registry: every puzzle task by the name ``metadata.json`` records as its ``task``.

The stream, the trainer, the evaluators, the verifiers and ``urm-ray data`` look a task up here
once and then use its `PuzzleTask` entry; nothing else branches on a task's name. A new task is
one module under ``data/tasks/`` ending with ``TASK = PuzzleTask(...)``, plus one line below.

    task = registry.of(meta)          # the dataset's task, its augmentation checked
    task.augment, task.verifier, task.versions, task.scoring
"""

from __future__ import annotations

from urm_ray.data.store import DatasetMeta
from urm_ray.data.tasks import coloring, maze, nqueens, sudoku
from urm_ray.data.tasks.arc import task as arc
from urm_ray.data.tasks.task import PuzzleTask
from urm_ray.errors import ConfigError, DataError

TASKS: dict[str, PuzzleTask] = {
    module.TASK.name: module.TASK for module in (sudoku, maze, nqueens, coloring, arc)
}
# held-out metrics start with one of these: eval/ on every task, then each task's own score's
HELD_OUT_PREFIXES: tuple[str, ...] = ("eval/", *(t.scoring.prefix for t in TASKS.values() if t.scoring))


def scored_by(metric: str) -> PuzzleTask | None:
    """The task whose own held-out score reports ``metric`` (None: no task's own score does)."""
    return next((t for t in TASKS.values() if t.scoring and metric.startswith(t.scoring.prefix)), None)


def get(name: str) -> PuzzleTask:
    """The task called ``name``; ConfigError listing the known ones otherwise."""
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name]


def of(meta: DatasetMeta, where: str = "metadata.json") -> PuzzleTask:
    """The task of a dataset; DataError naming ``where`` (its metadata file) when the metadata
    names an unknown task or an augmentation the task does not have."""
    if meta.task not in TASKS:
        raise DataError(f"{where}: task {meta.task!r} is not a known task; expected one of"
                        f" {sorted(TASKS)}")
    task = TASKS[meta.task]
    if meta.augmentation not in ("none", task.augmentation):
        raise DataError(f"{where}: augmentation {meta.augmentation!r} is not task {meta.task!r}'s;"
                        f" expected {task.augmentation!r} or 'none'")
    return task
