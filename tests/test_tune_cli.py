"""``urm-ray sweep / best / final`` argument handling and clean errors (exit code 2), no Ray."""

from pathlib import Path

import yaml

from urm_ray.cli import _parse, main


def test_overrides_may_follow_options():
    args = _parse(["sweep", "quickstart", "--name", "qs", "trials=3", "train.steps=50"])
    assert (args.space, args.name, args.overrides) == ("quickstart", "qs", ["trials=3", "train.steps=50"])
    assert _parse(["final", "qs", "--seeds", "2", "train.num_workers=2"]).overrides == ["train.num_workers=2"]


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
