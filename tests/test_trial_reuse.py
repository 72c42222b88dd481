"""A reused Tune trial actor starts its next trial only after the stopped one has cleaned up, even
when that clean-up (closing its MLflow run on a loaded database) takes longer than Tune's 2 s."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from ray import tune

from urm_ray.tune.trial import allow_slow_stops

CLEAN_UP_S = 3.0  # past Tune's default wait of 2 s


@pytest.mark.timeout(300)  # without the longer wait Tune's loop hangs on the failed reuse
def test_a_trial_slow_to_clean_up_does_not_fail_the_next_one_on_its_actor(ray_local, tmp_path: Path):
    def slow_to_stop(config: dict) -> None:  # defined here: Ray pickles it by value
        allow_slow_stops()
        try:
            for step in range(1, 100):
                tune.report({"step": step, "x": config["x"]})
        except SystemExit:  # how Tune stops a trial's thread
            time.sleep(CLEAN_UP_S)
            raise

    tuner = tune.Tuner(
        slow_to_stop,
        param_space={"x": tune.grid_search([1, 2, 3])},
        tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"step": 2}, verbose=0),
    )
    results = tuner.fit()
    assert results.num_errors == 0, [r.error for r in results]
    assert sorted(r.metrics["x"] for r in results) == [1, 2, 3]
    assert all(r.metrics["step"] == 2 for r in results)
