"""``urm-ray study STUDY.yaml --check [--gpu G]``: a study validated without running it.

Loading the study already checks every row (``spec.load_study``). With ``--gpu``, each row whose
trials train on GPUs is planned as ``urm-ray plan --space`` plans a space: its heaviest trial's
step memory on that GPU (``tune.plan``). The dataset's shape comes from its metadata when the
data is here, else from the row's benchmark (the shapes below, as the datasets are built by
``urm-ray data``); a row with neither is listed as not planned.
"""

from __future__ import annotations

from urm_ray.errors import ConfigError
from urm_ray.models.task import TaskSpec
from urm_ray.study.spec import Row, Study
from urm_ray.tune.plan import check_gpu, heaviest, plan, task_shape

# (tokens per row, token ids, puzzle-embedding rows) of each benchmark's dataset; 1 puzzle row
# where the count is not known here: the embedding table is then left out of the estimate
BENCHMARK_SHAPES = {
    "sudoku-extreme": (81, 11, 1),
    "maze-hard": (900, 6, 1),
    "arc-agi-1": (900, 12, 800801),
    "arc-agi-2": (900, 12, 1),
}


def check_study(study: Study, gpu: str = "") -> tuple[str, bool]:
    """A report line per row, and whether every planned row fits ``gpu``."""
    if gpu:
        check_gpu(gpu)
    lines, fits = [f"study {study.name}: {len(study.rows)} row(s), every space loads"], True
    for row in study.rows:
        line, row_fits = _check_row(row, gpu)
        lines.append(line)
        fits = fits and row_fits
    return "\n".join(lines), fits


def _check_row(row: Row, gpu: str) -> tuple[str, bool]:
    space = row.space
    head = (f"  {row.name}: {row.spec.family} on {row.spec.task or space.base_config.data.path}, "
            f"space {row.spec.space}, {row.trials} trials")
    if not gpu or space.spec.resources.gpus_per_worker == 0:
        return f"{head}; memory not planned ({'CPU trials' if gpu else 'no --gpu'})", True
    cfg = heaviest(space)
    shape = _shape(row, cfg)
    if shape is None:
        return f"{head}; memory not planned: no dataset here and no benchmark shape", True
    task, where = shape
    the_plan = plan(cfg, task, gpu)
    peak = the_plan.memory.peak(the_plan.rows) / (1 << 30)
    verdict = "fits" if the_plan.fits else "DOES NOT FIT"
    return f"{head}; heaviest trial on {gpu}: {peak:.1f} GiB peak ({where}) {verdict}", the_plan.fits


def _shape(row: Row, cfg) -> tuple[TaskSpec, str] | None:
    try:
        return task_shape(cfg, 0, 0, 1), "the dataset's shape"
    except ConfigError:
        pass
    if row.spec.benchmark in BENCHMARK_SHAPES:
        seq_len, vocab, puzzles = BENCHMARK_SHAPES[row.spec.benchmark]
        return TaskSpec(vocab, seq_len, puzzles), f"{row.spec.benchmark}'s shape"
    return None
