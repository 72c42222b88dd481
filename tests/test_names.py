"""Run, sweep and experiment names: one path component of letters, digits, '.', '_' and '-', not
starting with '.', bounded in length; the typed config checks them, and the default names pass."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from urm_ray.config import load_config
from urm_ray.errors import ConfigError
from urm_ray.names import MAX_LENGTH, SWEEP_MAX_LENGTH, check_name, timestamped
from urm_ray.tune.best import _seed_config
from urm_ray.tune.info import SweepInfo
from urm_ray.tune.space import load_space
from urm_ray.tune.trial import trial_run_name

BAD = ["../x", "/etc", "a'b", ".hidden", "a/b", "a b", "", "ä", "x" * (MAX_LENGTH + 1)]


@pytest.mark.parametrize("name", ["loops8", "a.b_c-d", "_x", "9", "x" * MAX_LENGTH])
def test_good_names_pass_unchanged(name: str):
    assert check_name("train.run_name", name) == name


@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_named_with_their_key_and_the_rule(name: str):
    with pytest.raises(ConfigError) as caught:
        check_name("train.run_name", name)
    message = str(caught.value)
    assert message.startswith("train.run_name=") and "\n" not in message
    assert repr(name)[:40] in message
    assert "letters, digits" in message or f"at most {MAX_LENGTH} characters" in message
    assert len(message) < 200  # a long value is cut in the message


@pytest.mark.parametrize("key, value", [("train.run_name", "../up"), ("tracking.experiment", "a'b"),
                                        ("tracking.experiment", ".x")])
def test_the_typed_config_checks_run_and_experiment_names(key: str, value: str):
    with pytest.raises(ConfigError, match=re.escape(f"{key}={value!r}")):
        load_config("sudoku4-urm", [f"{key}={value}"])
    assert load_config("sudoku4-urm", [f"{key}=ok-1.2_x"])


@pytest.mark.parametrize("stem", ["quickstart", "my space's copy", "..dots", "x" * 300, "'"])
def test_default_names_pass(stem: str):
    name = timestamped(stem, SWEEP_MAX_LENGTH)
    assert check_name("--name", name, SWEEP_MAX_LENGTH) == name
    assert re.search(r"\d{8}-\d{6}$", name)


def test_names_a_sweep_derives_from_the_longest_name_pass():
    """Trial, final and experiment names add to the sweep's name; they stay valid run names."""
    sweep = "s" * SWEEP_MAX_LENGTH
    space = load_space("quickstart")
    info = SweepInfo(sweep, "/tmp/none", "sqlite:///none.db", "sqlite:///none.db", f"sweep-{sweep}")
    check_name("tracking.experiment", info.experiment)
    check_name("train.run_name", trial_run_name(sweep, 9999))
    params = {"model.loops": 4, "model.truncation": 1, "model.max_segments": 4, "optim.lr": 1e-3}
    trial = SimpleNamespace(params=params, number=9999)  # what _seed_config reads of a FrozenTrial
    cfg = _seed_config(info, space, trial, seed=999)  # builds and validates the run config
    assert cfg.train.run_name == f"{sweep}-final-t9999-s999"
