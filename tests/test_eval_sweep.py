"""An evaluation sweep end to end (slow): a real sweep over the test-time settings of a trained
checkpoint on a private Ray instance, real Optuna and MLflow stores. Its trials evaluate and train
nothing; accuracy against passes per puzzle makes a Pareto front in the parent run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from urm_ray.config import load_config
from urm_ray.data.tasks import nqueens
from urm_ray.errors import ConfigError
from urm_ray.train.driver import fit
from urm_ray.tune.sweep import create_sweep, run_sweep

pytestmark = pytest.mark.slow

TRIALS = 5


def _space(checkpoint: str, **changes) -> dict:
    return {
        "checkpoint": checkpoint,
        "overrides": {"eval.max_rows": 32},
        "params": {
            "eval.width": {"type": "categorical", "choices": [1, 2, 4]},
            "eval.noise": {"type": "float", "low": 0.0, "high": 0.5},
            "eval.select": {"type": "categorical", "choices": ["vote", "q"]},
        },
        "objectives": [{"metric": "eval/testtime/exact_accuracy", "mode": "max"},
                       {"metric": "eval/testtime/passes_per_puzzle", "mode": "min"}],
        "start_from": [{"eval.width": 1, "eval.noise": 0.0, "eval.select": "vote"}],
        "trials": TRIALS,
        "resources": {"workers": 1, "cpus_per_worker": 0.4},
        "scheduler": {"name": "none"},
        "search": {"seed": 0, "startup_trials": 3},
        **changes,
    }


@pytest.fixture(scope="module")
def swept(tmp_path_factory, ray_local, sudoku_data):
    root = tmp_path_factory.mktemp("evalsweep")
    data = sudoku_data(num_train=300, num_test=40, blanks=8)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    trained = fit(load_config("sudoku4-urm", [
        f"data.path={data}", f"checkpoint.storage_path={root / 'runs'}", f"tracking.tracking_uri={uri}",
        "tracking.experiment=trained", "train.steps=30", "eval.every=0", "checkpoint.every=0",
        "train.log_every=10", "train.global_batch_size=32", "model.hidden_size=32", "model.num_heads=2",
        "model.max_segments=3", "train.run_name=trained", "resources.in_process=true",
    ]))
    space = _space(trained.checkpoint_path)
    space["params"]["eval.views"] = {"type": "categorical", "choices": [False, True]}  # sudoku has views
    space["start_from"][0]["eval.views"] = False
    (root / "tt.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    before = sorted(p.name for p in (root / "runs").iterdir())
    info, space = create_sweep(str(root / "tt.yaml"), [f"tracking.tracking_uri={uri}"], name="tt",
                               root=str(root / "sweeps"))
    outcome = run_sweep(info, space)
    return {"root": root, "uri": uri, "info": info, "outcome": outcome, "runs_before": before}


def test_an_evaluation_sweep_records_every_trial_and_trains_nothing(swept):
    trials = swept["info"].study().trials
    assert len(trials) == TRIALS and all(t.state == TrialState.COMPLETE for t in trials)
    assert all(len(t.values) == 2 for t in trials)
    client = MlflowClient(swept["uri"])
    experiment = client.get_experiment_by_name(swept["info"].experiment)
    children = client.search_runs([experiment.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{swept['info'].parent_run_id}'")
    assert sorted(r.info.run_name for r in children) == [f"tt-t{i:03d}" for i in range(TRIALS)]
    for run in children:
        assert run.data.tags["urm_ray.fate"] == "completed" and run.info.status == "FINISHED"
        metrics = set(run.data.metrics)
        assert {"eval/testtime/exact_accuracy", "eval/testtime/passes_per_puzzle",
                "eval/testtime/oracle_exact_accuracy"} <= metrics
        assert not any(m.startswith("train/") for m in metrics)  # nothing trained
        width = int(run.data.params["sampled.eval.width"])
        assert run.data.metrics["eval/testtime/passes_per_puzzle"] == width * 3 * 4  # segments x loops
        assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"testtime.png", "eval-test.json"}
    first = next(r for r in children if r.info.run_name == "tt-t000")  # the model as trained
    assert first.data.params["sampled.eval.width"] == "1"
    assert {r.data.params["sampled.eval.views"] for r in children} == {"False", "True"}
    # no checkpoints: no trial folder holds one, and no training run folder appeared
    assert not list((swept["root"] / "sweeps").rglob("checkpoint_*"))
    assert sorted(p.name for p in (swept["root"] / "runs").iterdir()) == swept["runs_before"]


def test_the_parent_run_holds_the_pareto_front(swept):
    client = MlflowClient(swept["uri"])
    plots = {a.path for a in client.list_artifacts(swept["info"].parent_run_id, "plots")}
    assert "plots/pareto_front.png" in plots


def test_an_evaluation_sweep_searches_test_time_settings_only(tmp_path: Path):
    folder = tmp_path / "checkpoint_0"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump({"model": {"name": "urm"}}))
    cases = [
        ({"params": {"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-3}}},
         "parameter optim.lr: an evaluation sweep .* searches the test-time settings eval.\\* only"),
        ({"objectives": [{"metric": "eval/exact_accuracy", "mode": "max"}]},
         "objective eval/exact_accuracy: an evaluation sweep reports eval/testtime/"),
        ({"scheduler": {"name": "asha"}}, "scheduler.name=asha: an evaluation trial reports once"),
        ({"checkpoint": ""}, "give base \\(a training sweep\\) or checkpoint \\(an evaluation sweep\\)"),
    ]
    for changes, message in cases:
        path = tmp_path / "space.yaml"
        path.write_text(yaml.safe_dump({**_space(str(folder)), **changes}))
        with pytest.raises(ConfigError, match=message):
            create_sweep(str(path), [], name="bad", root=str(tmp_path / "sweeps"))
    path.write_text(yaml.safe_dump(_space(str(tmp_path / "nowhere"))))
    with pytest.raises(ConfigError, match="nowhere: not a urm_ray checkpoint folder"):
        create_sweep(str(path), [], name="bad", root=str(tmp_path / "sweeps"))

    # views of a task with no augmentation: refused before any trial
    nqueens.build_unconditional(tmp_path / "queens", n=6, repeats=1)
    (folder / "config.yaml").write_text(yaml.safe_dump({"model": {"name": "urm"},
                                                        "data": {"path": str(tmp_path / "queens")}}))
    space = _space(str(folder))
    space["params"]["eval.views"] = {"type": "categorical", "choices": [False, True]}
    space["start_from"][0]["eval.views"] = False
    path.write_text(yaml.safe_dump(space))
    with pytest.raises(ConfigError, match="eval.views=true: the nqueens task has no augmentation"):
        create_sweep(str(path), [], name="bad", root=str(tmp_path / "sweeps"))
