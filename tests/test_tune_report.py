"""The end-of-sweep report on a hand-made study (no Ray): ranking, leaderboard rows, the best
config as a trainable config, and Optuna's plots as PNG files."""

from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from urm_ray.config import dump_yaml, load_config
from urm_ray.tune.report import PLOTS, best_config, leaderboard, ranked, write_plots
from urm_ray.tune.resources import plan
from urm_ray.tune.space import load_space

METRIC = "eval/exact_accuracy"


@pytest.fixture
def study_and_space():
    space = load_space("quickstart")
    study = optuna.create_study(direction="maximize")
    dists = {"model.loops": IntDistribution(2, 6), "model.truncation": IntDistribution(0, 5),
             "model.max_segments": IntDistribution(1, 4), "optim.lr": FloatDistribution(3e-4, 3e-3, log=True)}
    rows = [(TrialState.COMPLETE, 0.5, 4, 1), (TrialState.COMPLETE, 0.9, 3, 2),
            (TrialState.PRUNED, 0.1, 2, 0), (TrialState.FAIL, None, 5, 4), (TrialState.COMPLETE, 0.7, 6, 3)]
    for i, (state, value, loops, trunc) in enumerate(rows):
        params = {"model.loops": loops, "model.truncation": trunc, "model.max_segments": 2,
                  "optim.lr": 1e-3 * (1 + i / 10)}
        fate = {TrialState.COMPLETE: "completed", TrialState.PRUNED: "pruned",
                TrialState.FAIL: "failed"}[state]
        study.add_trial(create_trial(state=state, value=value, params=params, distributions=dists,
                                     user_attrs={"fate": fate, "last_step": 400},
                                     intermediate_values={100: value or 0.0}))
    return study, space


def test_ranking_and_leaderboard(study_and_space):
    study, space = study_and_space
    assert [t.number for t in ranked(study, space)] == [1, 4, 0]
    rows = leaderboard(study, space, {1: "run-1"})
    assert [r["trial"] for r in rows] == [1, 4, 0, 2, 3]
    assert rows[0]["rank"] == 1 and rows[0][METRIC] == 0.9 and rows[0]["mlflow_run_id"] == "run-1"
    assert [r["fate"] for r in rows[3:]] == ["pruned", "failed"] and rows[3]["rank"] == ""


def test_best_config_is_a_training_config(study_and_space, tmp_path: Path):
    """The sweep's fixed keys stay; the resources it fitted each trial with do not (final training
    would otherwise run on the trials' CPU shares and device)."""
    study, space = study_and_space
    trial_plan = plan({"CPU": 2.0}, space.spec.resources, 0, space.spec.trials)
    overrides = {**trial_plan.train_overrides(), "resources.worker_resources.spot": 1.0,
                 "data.path": "/data/sudoku4"}
    cfg = best_config(space, ranked(study, space)[0], overrides)
    base = space.base_config.resources
    assert (cfg.model.loops, cfg.model.truncation, cfg.data.path) == (3, 2, "/data/sudoku4")
    assert trial_plan.train_overrides()["resources.device"] == "cpu" != base.device
    for key in ("num_workers", "cpus_per_worker", "gpus_per_worker", "device", "torch_threads",
                "worker_resources"):
        assert getattr(cfg.resources, key) == getattr(base, key), key
    (tmp_path / "best.yaml").write_text(dump_yaml(cfg))
    assert load_config(str(tmp_path / "best.yaml")).optim.lr == cfg.optim.lr


def test_plots_are_written(study_and_space, tmp_path: Path):
    study, space = study_and_space
    written = write_plots(study, space, tmp_path / "plots")
    assert {p.stem for p in written} == set(PLOTS)
    assert all(p.stat().st_size > 1000 for p in written)
