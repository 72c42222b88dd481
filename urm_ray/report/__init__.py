"""The HTML report of a sweep or a study: a page a person looks at rather than reads.

    urm-ray report NAME [--dir sweeps]     # (re)build sweeps/NAME/report.html and upload it

A finished sweep of ``urm-ray sweep`` or ``urm-ray study`` writes ``report.html`` into its folder
and uploads it to its parent MLflow run (``publish_after_sweep``); ``urm-ray report`` rebuilds it at
any time, also while the sweep runs or after it was interrupted. ``data.py`` gathers the numbers,
``plots.py`` draws them, ``html.py`` writes the page.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from urm_ray.report.data import sweep_data
from urm_ray.report.html import write_study, write_sweep

if TYPE_CHECKING:
    from urm_ray.tune.info import SweepInfo
    from urm_ray.tune.space import SearchSpace

logger = logging.getLogger(__name__)

REPORT_FILE = "report.html"


def sweep_report(name: str, study: optuna.Study, space: SearchSpace, folder: Path,
                 costs: dict[int, dict[str, float]] | None = None,
                 leaderboard: list[dict[str, Any]] | None = None) -> Path:
    """Write ``<folder>/report.html`` for the sweep ``name`` and return its path."""
    return write_sweep(sweep_data(name, study, space, costs, leaderboard), folder / REPORT_FILE)


def publish(info: SweepInfo, space: SearchSpace) -> Path:
    """The report of a sweep drawn from its study and MLflow runs, written to its folder and
    uploaded to its parent run."""
    from urm_ray import tracking
    from urm_ray.tracking import TRIAL_TAG
    from urm_ray.tune import cost
    from urm_ray.tune.report import leaderboard

    study = info.study()
    runs = tracking.child_runs(info.tracking_uri, info.experiment, info.parent_run_id) if info.parent_run_id else []
    run_ids = {int(r.tags[TRIAL_TAG]): r.run_id for r in runs if TRIAL_TAG in r.tags}
    costs = cost.trial_costs(info) if info.parent_run_id else {}
    path = sweep_report(info.name, study, space, info.path, costs, leaderboard(study, space, run_ids, costs))
    if info.parent_run_id:
        tracking.Run(info.tracking_uri, info.parent_run_id).log_artifact(path)
    return path


def publish_after_sweep(info: SweepInfo, space: SearchSpace) -> Path | None:
    """``publish`` at the end of a sweep, where the page is a view: the sweep's results stand
    without it, so a page that cannot be drawn is a warning naming the command that draws it."""
    try:
        return publish(info, space)
    except (ValueError, RuntimeError, OSError) as err:
        logger.warning("report.html not written (%s); `urm-ray report %s` draws it again", err, info.name)
        return None


def rebuild(name: str, root: str) -> Path:
    """``publish`` for the sweep ``name`` in ``root``: at any time, also while the sweep runs or
    after it was interrupted."""
    from urm_ray.tune.sweep import load_sweep

    return publish(*load_sweep(name, root))


__all__ = ["REPORT_FILE", "publish", "publish_after_sweep", "rebuild", "sweep_report", "write_study", "write_sweep"]
