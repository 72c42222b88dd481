"""The HTML report: built from a sweep's study and MLflow runs (no Ray), rebuilt by
``urm-ray report``, uploaded to the parent run, and drawn by a real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import optuna
import pytest
from matplotlib.image import imread
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from urm_ray import tracking
from urm_ray.cli import main
from urm_ray.report import REPORT_FILE, sweep_report, write_study
from urm_ray.study.table import Cell, StudyTable, TableRow
from urm_ray.tracking import TRIAL_TAG
from urm_ray.tune import cost
from urm_ray.tune.search import EVALS_ATTR
from urm_ray.tune.space import load_space
from urm_ray.tune.sweep import create_sweep

DISTS = {"model.loops": IntDistribution(2, 6), "model.truncation": IntDistribution(0, 5),
         "model.max_segments": IntDistribution(1, 4), "optim.lr": FloatDistribution(5e-4, 3e-3, log=True)}
# fate, evaluations at 250-step intervals (quickstart: ASHA rungs at steps 250 and 500)
TRIALS = [("completed", [0.2, 0.5, 0.7, 0.80]), ("pruned", [0.1]), ("completed", [0.3, 0.6, 0.8, 0.92]),
          ("pruned", [0.25, 0.4]), ("failed", [0.2]), ("completed", [0.2, 0.45, 0.6, 0.71])]
STATES = {"completed": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}


def _params(i: int) -> dict:
    return {"model.loops": 2 + i % 5, "model.truncation": i % 2, "model.max_segments": 1 + i % 4,
            "optim.lr": 6e-4 * (1 + i / 3)}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[str, Path, str]:
    """A sweep as `urm-ray sweep` leaves it (its folder, its study's trials, its MLflow runs),
    and its report rebuilt by `urm-ray report`; built once for the module (MLflow's database
    takes seconds to create)."""
    tmp_path = tmp_path_factory.mktemp("report")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    root = tmp_path / "sweeps"
    info, _ = create_sweep("quickstart", [f"tracking.tracking_uri={uri}"], "qs", str(root))
    info.parent_run_id = tracking.open_run(uri, info.experiment, "qs", {})
    info.save()
    study = optuna.create_study(study_name="qs", storage=info.storage, direction="maximize")
    for i, (fate, evals) in enumerate(TRIALS):
        curve = {250 * (k + 1): v for k, v in enumerate(evals)}
        study.add_trial(create_trial(state=STATES[fate], value=evals[-1] if fate == "completed" else None,
                                     params=_params(i), distributions=DISTS, intermediate_values=curve,
                                     user_attrs={"fate": fate, "last_step": max(curve)}))
        run_id = tracking.open_run(uri, info.experiment, f"qs-t{i:03d}", {},
                                   {tracking.PARENT_TAG: info.parent_run_id, TRIAL_TAG: str(i)})
        tracking.Run(uri, run_id).log_metrics({cost.DEVICE_SECONDS: 900.0 * len(evals)}, 1)
    assert main(["report", "qs", "--dir", str(root)]) == 0
    return uri, root, info.parent_run_id


def _images(page: str) -> list[str]:
    return re.findall(r'<img class=plot alt="([^"]+)"', page)


def test_report_rebuilt_and_uploaded(sweep):
    uri, root, parent = sweep
    page = (root / "qs" / REPORT_FILE).read_text()
    assert _images(page) == ["Learning curves", "Search progress", "Parameter importances", "ASHA rungs"]
    assert "stopped: t001 at step 250, t003 at step 500" in page  # the rungs each pruned trial reached
    assert "http" not in page.replace("<!doctype html>", "")  # nothing fetched from a network
    # the leaderboard: best first, with each trial's MLflow run id
    rows = re.findall(r"<tr><td>(\d*)</td><td>(\d+)</td><td>(\w+)</td>", page)
    assert rows[:3] == [("1", "2", "completed"), ("2", "0", "completed"), ("3", "5", "completed")]
    artifacts = [a.path for a in tracking._client(uri).list_artifacts(parent)]
    assert REPORT_FILE in artifacts


def test_report_of_an_unknown_sweep_is_a_config_error(tmp_path: Path, capsys):
    root = tmp_path / "sweeps"
    assert main(["report", "nope", "--dir", str(root)]) == 2
    assert "no sweep 'nope'" in capsys.readouterr().err
    assert not root.exists()  # nothing written


def test_several_objectives_draw_the_front(tmp_path: Path):
    space = load_space("sudoku4-pareto")
    study = optuna.create_study(directions=[o.mode + "imize" for o in space.spec.objectives])
    points = [(0.9, 8.0), (0.7, 3.0), (0.6, 5.0), (0.95, 12.0)]  # (0.6, 5.0) is dominated by (0.7, 3.0)
    for values in points:
        study.add_trial(create_trial(state=TrialState.COMPLETE, values=list(values), params={},
                                     distributions={}, user_attrs={"fate": "completed",
                                                                   EVALS_ATTR: {"250": list(values)}}))
    page = sweep_report("two", study, space, tmp_path).read_text()
    assert "Pareto front" in _images(page)
    assert "front: t003, t000, t001" in page
    assert "Learning curves" in _images(page)


def _study_table() -> StudyTable:
    metric = "eval/exact_accuracy"
    rows = [TableRow(name, "sudoku4", family, "", f"s-{name}", {metric: Cell(metric, values)}, (0, 1, 2),
                     0.1, cost.DEVICE_SECONDS) for name, family, values in
            (("urm", "urm", (0.9, 0.92, 0.88)), ("trm", "trm", (0.8, 0.85, 0.83)))]
    return StudyTable("families", [metric], rows)


def test_study_report_draws_seed_bands(tmp_path: Path):
    curves = {"urm": [[(100, 0.5), (200, 0.9)], [(100, 0.6), (200, 0.92)]], "trm": [[(100, 0.4), (200, 0.8)]]}
    table = _study_table()
    page = write_study(table.study, table.metrics[0], table.page_rows(), curves, tmp_path / REPORT_FILE).read_text()
    assert _images(page) == ["Learning curves over seeds"]
    assert "0.9000 +- 0.0200" in page  # urm's mean +- sd over its three seeds


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
# after load: each plot's decoded size and where it sits on the page, written into the DOM
PROBE = ("<script>window.addEventListener('load', () => document.body.setAttribute('data-plots', "
         "JSON.stringify([...document.images].map(i => {const r = i.getBoundingClientRect(); "
         "return [i.naturalWidth, r.left, r.top + scrollY, r.width, r.height];}))));</script>")
WIDTH = 1100


def _chromium(*args: str) -> str:
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={WIDTH},3200", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (.ci/run installs Debian's chromium)")
def test_every_plot_is_drawn_in_chromium(sweep, tmp_path: Path):
    _, root, _ = sweep
    page = (root / "qs" / REPORT_FILE).read_text()
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", PROBE + "</body>"))
    dom = _chromium("--dump-dom", probed.as_uri())
    plots = json.loads(re.search(r'data-plots="([^"]+)"', dom).group(1).replace("&quot;", '"'))
    assert len(plots) == len(_images(page)) == 4
    assert all(width > 0 for width, *_ in plots)  # every image decoded
    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", (root / "qs" / REPORT_FILE).as_uri())
    pixels = imread(shot)[..., :3]  # [H, W, 3] in 0..1
    for _, left, top, width, height in plots:
        region = pixels[int(top):int(top + height), int(left):int(left + width)]
        assert region.size and (region.min(axis=-1) < 0.9).mean() > 0.02  # lines and text, not a blank box
    assert np.isfinite(pixels).all()
