"""``urm-ray sweep / best / final`` argument handling and clean errors (exit code 2), no Ray."""

from pathlib import Path

import yaml

from urm_ray.cli import _parse, main


def test_overrides_may_follow_options():
    args = _parse(["sweep", "quickstart", "--name", "qs", "trials=3", "train.steps=50"])
    assert (args.space, args.name, args.overrides) == ("quickstart", "qs", ["trials=3", "train.steps=50"])
    assert _parse(["final", "qs", "--seeds", "2", "resources.num_workers=2"]).overrides == ["resources.num_workers=2"]


def test_invalid_space_fails_before_anything_runs(tmp_path: Path, capsys):
    space = {"base": "sudoku4-urm", "params": {"model.loopz": {"type": "int", "low": 2, "high": 4}}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(space))
    assert main(["sweep", str(path), "--dir", str(tmp_path / "sweeps")]) == 2
    assert "model.loopz: unknown config key" in capsys.readouterr().err
    assert not (tmp_path / "sweeps").exists()  # nothing created for a rejected space


def test_missing_space_sweep_and_resume_conflicts(tmp_path: Path, capsys):
    assert main(["sweep", "no-such-space"]) == 2
    assert "shipped spaces" in capsys.readouterr().err
    assert main(["sweep"]) == 2
    assert main(["sweep", "quickstart", "--resume", "x"]) == 2
    assert main(["best", "nope", "--dir", str(tmp_path)]) == 2
    assert "no sweep 'nope'" in capsys.readouterr().err


def test_a_reused_sweep_name_does_not_adopt_an_earlier_sweeps_runs_or_trials(tmp_path: Path):
    """The folder of sweep `qs` was deleted but its MLflow runs remain; a shared Optuna storage
    holds a study `qs2` with trials: both names are refused, naming what holds them."""
    import optuna
    import pytest

    from urm_ray import tracking
    from urm_ray.errors import ConfigError
    from urm_ray.tune.sweep import create_sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [f"tracking.tracking_uri={uri}"]
    root = str(tmp_path / "sweeps")
    create_sweep("quickstart", overrides, "qs", root)
    tracking.open_run(uri, "sweep-qs", "qs/t000", {})  # what its first trial left in MLflow
    (tmp_path / "sweeps" / "qs" / "sweep.json").unlink()  # the user deletes the folder's record
    with pytest.raises(ConfigError, match="already holds 1 runs of an earlier sweep"):
        create_sweep("quickstart", overrides, "qs", root)
    shared = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(study_name="qs2", storage=shared)
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.5))
    with pytest.raises(ConfigError, match="study 'qs2' with 1 trials"):
        create_sweep("quickstart", overrides, "qs2", root, shared)
    info, _ = create_sweep("quickstart", overrides, "qs3", root, shared)  # a new name is fine
    assert info.name == "qs3"
