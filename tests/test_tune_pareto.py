"""Sweeps with several objectives: the Pareto front, the dominance rule at each rung, and a tiny
two-objective sweep end to end (accuracy against block-stack passes, real Ray, Optuna and MLflow).

The sweep runs three trials one at a time: a good config first, then a hopeless learning rate at
more loops (costlier and no more accurate, so the first trial dominates it at the first rung and
it stops there), then the cheapest config, which nothing can dominate. Its front must be
non-dominated, a pruned trial never on it, and recorded in ``pareto.csv``, the leaderboard and
the trials' tags; ``best`` prints it and ``final --pick`` trains a member and refuses the rest.
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState, create_trial
from ray.tune.schedulers import TrialScheduler

from urm_ray.cli import main
from urm_ray.errors import ConfigError
from urm_ray.tune import pareto
from urm_ray.tune.best import FinalRequest, final
from urm_ray.tune.rungs import StudyDominance
from urm_ray.tune.search import EVALS_ATTR, TRIAL_KEY
from urm_ray.tune.space import Objective, load_space
from urm_ray.tune.sweep import create_sweep, run_sweep

ACCURACY, COST = "eval/token_accuracy", "cost/passes"
OBJECTIVES = [Objective(ACCURACY, "max"), Objective(COST, "min")]
SPACE = {
    "base": "sudoku4-urm",
    "overrides": {
        "model.hidden_size": 32, "model.num_heads": 2, "model.num_layers": 1,
        "model.expansion": 1.0, "train.steps": 20,
        "train.global_batch_size": 16, "train.log_every": 5, "eval.every": 10,
        "checkpoint.every": 10, "eval.max_rows": 32, "optim.warmup_steps": 2,
    },
    "params": {
        "model.loops": {"type": "int", "low": 2, "high": 3},
        "model.truncation": {"type": "int", "low": 0, "high": "model.loops - 1"},
        "model.max_segments": {"type": "int", "low": 1, "high": 2},
        "optim.lr": {"type": "log_float", "low": 1.0e-5, "high": 3.0e-3},
    },
    "derived": {COST: "model.loops * model.max_segments"},
    "objectives": [{"metric": ACCURACY, "mode": "max"}, {"metric": COST, "mode": "min"}],
    "start_from": [
        {"model.loops": 2, "model.truncation": 1, "model.max_segments": 2, "optim.lr": 3.0e-3},
        # costlier than the first (6 passes against 4) and learns nothing: dominated at step 10
        {"model.loops": 3, "model.truncation": 1, "model.max_segments": 2, "optim.lr": 1.0e-5},
        # the cheapest (2 passes): no trial can dominate it, it completes on the front
        {"model.loops": 2, "model.truncation": 0, "model.max_segments": 1, "optim.lr": 2.0e-3},
    ],
    "trials": 3,
    "concurrency": 1,  # one at a time: the rung holds the first trial when the second reaches it
    "resources": {"workers": 1, "cpus_per_worker": 0.4},
    "scheduler": {"name": "asha", "grace_steps": 10, "reduction_factor": 2},
    "search": {"seed": 0, "startup_trials": 2},
    "final": {"top": 1, "seeds": 1, "overrides": {"train.steps": 10}},
}


def _done(number: int, values: list[float]) -> optuna.trial.FrozenTrial:
    trial = create_trial(values=values, params={}, distributions={})
    trial.number = number
    return trial


def test_front_keeps_exactly_the_non_dominated_completed_trials():
    trials = [_done(0, [0.9, 8.0]), _done(1, [0.8, 4.0]), _done(2, [0.7, 6.0]),  # 2: beaten by 1
              _done(3, [0.9, 8.0]), _done(4, [0.5, 1.0])]  # 3 ties 0: both stay
    pruned = create_trial(state=TrialState.PRUNED, params={}, distributions={})
    front = pareto.pareto_front([*trials, pruned], OBJECTIVES)
    assert [t.number for t in front] == [0, 3, 1, 4]  # most accurate first, ties by number
    assert pareto.pick(trials, OBJECTIVES, 1).number == 1
    with pytest.raises(ConfigError, match=r"--pick 2: trial 2 is not on the Pareto front \(front trials: 0, 3, 1, 4\)"):
        pareto.pick(trials, OBJECTIVES, 2)


def _space(tmp_path: Path, **changes) -> Path:
    data = {**SPACE, **changes}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}, sort_keys=False))
    return path


def test_one_objective_as_metric_and_mode_and_both_forms_refused(tmp_path):
    one = load_space(str(_space(tmp_path, objectives=None, metric=ACCURACY, mode="max")))
    assert [(o.metric, o.mode) for o in one.spec.objectives] == [(ACCURACY, "max")]
    with pytest.raises(ConfigError, match="give either metric and mode .* or objectives"):
        load_space(str(_space(tmp_path, metric=ACCURACY, mode="max")))
    with pytest.raises(ConfigError, match="metric .* or objectives .*, not both"):
        load_space(str(_space(tmp_path, objectives=None, metric=ACCURACY)), ["objectives=[]"])


@pytest.mark.parametrize(("override", "message"), [
    ("search.pruned_as=complete", "search.pruned_as=complete with several objectives"),
    ("scheduler.name=median", "scheduler.name=median compares the first objective alone"),
])
def test_early_values_never_reach_the_front(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        load_space(str(_space(tmp_path)), [override])


def _trial(number: int) -> SimpleNamespace:
    return SimpleNamespace(trial_id=f"id{number}", config={TRIAL_KEY: number})


def test_dominance_rungs_stop_only_dominated_trials_also_after_a_restart(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(storage=url, study_name="s", directions=["maximize", "minimize"])
    earlier = study.ask()  # reached step 10 before the restart: accuracy 0.6 at 4 passes
    earlier.set_user_attr(EVALS_ATTR, {"10": [0.6, 4.0]})
    rungs = StudyDominance([ACCURACY, COST], ["max", "min"], max_t=40, grace=10, rf=2.0,
                           storage_url=url, study_name="s")

    def judge(number: int, accuracy: float, passes: float) -> str:
        return rungs.on_trial_result(None, _trial(number), {"step": 10, ACCURACY: accuracy, COST: passes})

    assert judge(1, 0.5, 6.0) == TrialScheduler.STOP  # worse on both than the study's trial 0
    assert judge(2, 0.5, 2.0) == TrialScheduler.CONTINUE  # less accurate, but cheaper
    assert judge(3, 0.7, 8.0) == TrialScheduler.CONTINUE  # costlier, but more accurate
    assert judge(4, 0.6, 4.0) == TrialScheduler.CONTINUE  # ties trial 0: not dominated
    assert judge(5, float("nan"), 1.0) == TrialScheduler.STOP  # cheapest, but its accuracy is NaN
    assert rungs.on_trial_result(None, _trial(1), {"step": 20, ACCURACY: 0.1, COST: 9.0}) == TrialScheduler.CONTINUE


@pytest.fixture(scope="module")
def sweep(ray_local, sudoku_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("pareto")
    data = sudoku_data(num_train=300, num_test=64, blanks=8)
    (root / "two.yaml").write_text(yaml.safe_dump(SPACE, sort_keys=False))
    uri = f"sqlite:///{root / 'mlflow.db'}"
    info, space = create_sweep(str(root / "two.yaml"), [f"data.path={data}", f"tracking.tracking_uri={uri}"],
                               name="two", root=str(root))
    outcome = run_sweep(info, space)
    return {"root": root, "uri": uri, "info": info, "space": space, "outcome": outcome,
            "trials": info.study().trials}


@pytest.mark.slow
def test_sweep_stops_a_dominated_trial_and_records_a_sound_front(sweep):
    trials, info = sweep["trials"], sweep["info"]
    assert sweep["outcome"].finished == 3
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert [t.number for t in pruned] == [1], [(t.number, t.state, t.user_attrs) for t in trials]
    assert pruned[0].user_attrs["last_step"] < 20 and "10" in pruned[0].user_attrs[EVALS_ATTR]
    front = pareto.pareto_front(trials, OBJECTIVES)
    assert {t.number for t in front} == {0, 2} or {t.number for t in front} == {2}
    signs = pareto.signs(OBJECTIVES)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    for a, b in itertools.product(done, front):  # no completed trial dominates a member
        assert not pareto.dominates(pareto.signed(a.values, signs), pareto.signed(b.values, signs)), (a, b)
    with (info.path / pareto.PARETO_FILE).open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["trial"]) for r in rows] == [t.number for t in front]
    assert [float(r[COST]) for r in rows] == [t.values[1] for t in front]
    board = {int(r["trial"]): r for r in csv.DictReader((info.path / "leaderboard.csv").open())}
    assert {n for n, r in board.items() if r["pareto"] == "yes"} == {t.number for t in front}
    client = MlflowClient(sweep["uri"])
    parent = client.get_run(info.parent_run_id)
    assert pareto.PARETO_FILE in {a.path for a in client.list_artifacts(parent.info.run_id)}
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{info.parent_run_id}'")
    tags = {int(r.data.tags["urm_ray.trial"]): r.data.tags[pareto.PARETO_TAG] for r in children}
    assert tags == {t.number: str(t in front).lower() for t in trials}


@pytest.mark.slow
def test_best_prints_the_front_and_final_trains_only_a_member(sweep, capsys):
    root, front = str(sweep["root"]), pareto.pareto_front(sweep["trials"], OBJECTIVES)
    assert main(["best", "two", "--dir", root]) == 0
    printed = capsys.readouterr().out
    assert f"# Pareto front ({len(front)} trials" in printed
    assert all(f"# t{t.number:03d} " in printed for t in front)
    assert yaml.safe_load(printed)["model"]["loops"] == front[0].params["model.loops"]
    assert main(["final", "two", "--dir", root, "--pick", "1"]) == 2  # pruned: off the front
    assert "trial 1 is not on the Pareto front" in capsys.readouterr().err
    outcome = final("two", root, FinalRequest(pick=front[-1].number))
    assert outcome.winner == front[-1].number and outcome.model_version == "1"
    assert outcome.metrics["step"] == 10
