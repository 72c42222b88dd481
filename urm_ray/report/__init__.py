"""The HTML report of a sweep or a study: a page a person looks at rather than reads.

    urm-ray report NAME [--dir sweeps]     # (re)build sweeps/NAME/report.html and upload it

A finished sweep writes ``report.html`` into its folder and uploads it to its parent MLflow run
(``tune/report.py``); this rebuilds it at any time, also while the sweep runs or after it was
interrupted. ``data.py`` gathers the numbers, ``plots.py`` draws them, ``html.py`` writes the page.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from urm_ray.report.data import sweep_data
from urm_ray.report.html import write_study, write_sweep

if TYPE_CHECKING:
    from urm_ray.tune.space import SearchSpace

REPORT_FILE = "report.html"


def sweep_report(name: str, study: optuna.Study, space: SearchSpace, folder: Path,
                 costs: dict[int, dict[str, float]] | None = None,
                 leaderboard: list[dict[str, Any]] | None = None) -> Path:
    """Write ``<folder>/report.html`` for the sweep ``name`` and return its path."""
    return write_sweep(sweep_data(name, study, space, costs, leaderboard), folder / REPORT_FILE)


def rebuild(name: str, root: str) -> Path:
    """The report of sweep ``name`` in ``root`` rebuilt from its study and MLflow runs, written to
    its folder and uploaded to its parent run."""
    from urm_ray import tracking
    from urm_ray.tracking import TRIAL_TAG
    from urm_ray.tune import cost
    from urm_ray.tune.report import leaderboard
    from urm_ray.tune.sweep import load_sweep

    info, space = load_sweep(name, root)
    study = info.study()
    runs = tracking.child_runs(info.tracking_uri, info.experiment, info.parent_run_id) if info.parent_run_id else []
    run_ids = {int(r.tags[TRIAL_TAG]): r.run_id for r in runs if TRIAL_TAG in r.tags}
    costs = cost.trial_costs(info) if info.parent_run_id else {}
    path = sweep_report(name, study, space, info.path, costs, leaderboard(study, space, run_ids, costs))
    if info.parent_run_id:
        tracking.log_artifact(info.tracking_uri, info.parent_run_id, path)
    return path


__all__ = ["REPORT_FILE", "rebuild", "sweep_report", "write_study", "write_sweep"]
