"""The run's session: where a run's loop runs, chosen in one place, and train/ free of Ray Tune."""

from __future__ import annotations

import re
from pathlib import Path

from urm_ray.config import load_config
from urm_ray.train.session import PROCESS, TRIAL, WORKERS, choose_host, resolve

TRAIN = Path(__file__).parents[1] / "urm_ray" / "train"


def test_train_imports_no_ray_tune():
    """Every Ray Train worker loads train/; Ray Tune lives in urm_ray/tune/ alone."""
    tune = re.compile(r"\bray\.tune|from ray import tune")
    found = [f"{path.name}:{n}" for path in sorted(TRAIN.glob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if tune.search(line)]
    assert found == []


def test_the_host_follows_from_the_inputs_alone(tmp_path: Path):
    def cfg(*overrides: str):
        return resolve(load_config("sudoku4-urm", [f"checkpoint.storage_path={tmp_path}",
                                                   "resources.in_process=true", *overrides]))

    assert choose_host(cfg(), in_sweep=False) == PROCESS
    assert choose_host(cfg(), in_sweep=True) == TRIAL
    several = cfg("resources.in_process=false", "resources.num_workers=2")
    assert choose_host(several, in_sweep=True) == WORKERS
    assert choose_host(several, in_sweep=False) == WORKERS
    assert choose_host(cfg("resources.in_process=false"), in_sweep=False) == WORKERS
