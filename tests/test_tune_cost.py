"""Cost totals, caps and the sweep's budget flags, without Ray (fast). The costs a real sweep
records, and a cap stopping one, are checked end to end in test_tune_extend.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from ray.tune.utils.util import _atomic_save, _load_newest_checkpoint

from urm_ray import tracking
from urm_ray.cli import main
from urm_ray.errors import ConfigError
from urm_ray.tracking import TRIAL_TAG
from urm_ray.tune import cost
from urm_ray.tune.info import SweepInfo
from urm_ray.tune.sweep import create_sweep, set_caps


@pytest.fixture
def info(tmp_path: Path) -> SweepInfo:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    made, _ = create_sweep("quickstart", [f"tracking.tracking_uri={uri}"], "qs", str(tmp_path / "sweeps"))
    made.parent_run_id = tracking.open_run(uri, made.experiment, "qs", {})
    for number, device_s in enumerate((1800.0, 5400.0)):
        tags = {tracking.PARENT_TAG: made.parent_run_id, TRIAL_TAG: str(number)}
        run_id = tracking.open_run(uri, made.experiment, f"qs-t{number:03d}", {}, tags)
        tracking.Run(uri, run_id).log_metrics({cost.DEVICE_SECONDS: device_s, cost.CPU_SECONDS: 60.0}, 1)
    return made


def test_the_sweep_sums_its_trials_and_prices_them(info: SweepInfo):
    costs = cost.trial_costs(info)
    assert costs == {0: {cost.DEVICE_SECONDS: 1800.0, cost.CPU_SECONDS: 60.0},
                     1: {cost.DEVICE_SECONDS: 5400.0, cost.CPU_SECONDS: 60.0}}
    assert cost.sweep_cost(info, costs) == {"cost/device_hours": 2.0, "cost/cpu_hours": pytest.approx(120 / 3600)}
    set_caps(info, price=2.5)
    assert cost.sweep_cost(info, costs)["cost/usd"] == 5.0


def test_caps_name_the_flag_once_reached(info: SweepInfo):
    assert cost.cap_reached(info) == ""
    set_caps(info, max_device_hours=3.0)
    assert cost.cap_reached(info) == ""
    set_caps(info, max_device_hours=2.0)
    assert cost.cap_reached(info).startswith("--max-device-hours 2 reached (2 device-hours)")
    info.max_device_hours, info.spent_s = 0.0, 7200.0  # two hours in earlier runs of the sweep
    set_caps(info, max_hours=2.0)
    assert cost.cap_reached(info).startswith("--max-hours 2 reached")
    assert SweepInfo.load(info.path).max_hours == 2.0  # recorded in sweep.json


def test_a_cap_must_be_above_zero(info: SweepInfo):
    with pytest.raises(ConfigError, match="--max-hours 0.0: expected a number above 0"):
        set_caps(info, max_hours=0.0)
    with pytest.raises(ConfigError, match="--price -1.0"):
        set_caps(info, price=-1.0)


def test_reopen_lets_tunes_saved_generator_make_more_trials(tmp_path: Path):
    state = {"counter": 2, "total_samples": 2, "finished": True, "experiment": None}
    _atomic_save(state, str(tmp_path), "search_gen_state-2026-01-01.json", "tmp")
    cost.reopen(tmp_path, 4)
    assert _load_newest_checkpoint(str(tmp_path), cost.SEARCH_STATE) == {**state, "total_samples": 4,
                                                                        "finished": False}


def test_sweep_flags_that_do_not_go_together(tmp_path: Path, capsys):
    root = str(tmp_path / "sweeps")
    assert main(["sweep", "quickstart", "--trials", "4", "--dir", root]) == 2
    assert "--trials N extends a sweep with --resume" in capsys.readouterr().err
    assert main(["sweep", "--resume", "qs", "--warm-start", "other", "--dir", root]) == 2
    assert "give no SPACE, overrides or --warm-start" in capsys.readouterr().err
    assert main(["sweep", "quickstart", "--warm-start", "nope:2", "--dir", root]) == 2
    assert "no sweep 'nope'" in capsys.readouterr().err
    assert main(["sweep", "quickstart", "--warm-start", "nope:x", "--dir", root]) == 2
    assert "SWEEP:k with k a positive integer" in capsys.readouterr().err
    assert not Path(root).exists()  # nothing created for a refused sweep
