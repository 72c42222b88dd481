"""The resource plan: concurrency from the cluster and the space, a CPU left for Ray Data, and
requests that cannot be placed fail at once saying what is missing."""

import pytest

from urm_ray.errors import ConfigError
from urm_ray.tune.resources import DATA_CPUS, TRIAL_CPUS, is_resource_key, plan, without_resources
from urm_ray.tune.space import Resources


def test_two_cpu_laptop_runs_two_small_trials():
    p = plan({"CPU": 2.0}, Resources(workers=1, cpus_per_worker=0.4), requested=0, trials=12)
    assert p.concurrency == 2 and p.torch_threads == 1
    assert p.concurrency * p.trial_total_cpus + DATA_CPUS <= 2.0
    assert p.train_overrides()["resources.device"] == "cpu"


def test_every_planned_key_is_a_resource_key():
    """What the plan sets per trial is exactly what the best config and final training drop."""
    p = plan({"CPU": 8.0, "GPU": 1.0, "spot": 1.0}, Resources(1, 1.0, 1.0, {"spot": 1.0}), 0, 1)
    assert "resources.worker_resources.spot" in p.train_overrides()
    assert all(is_resource_key(key) for key in p.train_overrides())
    kept = {"data.path": "/d", "train.steps": 5, "train.seed": 1}
    assert without_resources({**p.train_overrides(), **kept}) == kept


def test_concurrency_never_exceeds_trials_or_room():
    assert plan({"CPU": 2.0}, Resources(1, 0.45), 0, 12).concurrency == 2  # 2 * 0.45 <= 2 - 1
    assert plan({"CPU": 2.0}, Resources(1, 0.55), 0, 12).concurrency == 1
    assert plan({"CPU": 64.0}, Resources(1, 1.0), 0, 4).concurrency == 4
    p = plan({"CPU": 16.0}, Resources(2, 2.0), 0, 12)
    assert p.concurrency == 3 and p.torch_threads == 2  # 3 * (0.1 + 4) <= 15


def test_gpu_trials_are_bounded_by_gpus():
    p = plan({"CPU": 32.0, "GPU": 4.0}, Resources(2, 4.0, 1.0), 0, 10)
    assert p.concurrency == 2
    assert p.train_overrides()["resources.device"] == "cuda"


@pytest.mark.parametrize("cluster, res, requested, match", [
    ({"CPU": 2.0}, Resources(1, 1.5), 0, "needs 2.5 CPUs"),
    ({"CPU": 4.0}, Resources(2, 1.5), 0, "needs 4.1 CPUs \\(0.1 for the trial actor"),
    ({"CPU": 1.0}, Resources(1, 0.1), 0, "CPU missing"),
    ({"CPU": 16.0, "GPU": 1.0}, Resources(2, 1.0, 1.0), 0, "needs 2 GPUs"),
    ({"CPU": 16.0}, Resources(1, 1.0, 1.0), 0, "the cluster has 0"),
    ({"CPU": 2.0}, Resources(1, 0.4), 3, "concurrency=3 needs 2.2 CPUs"),
])
def test_unplaceable_requests_fail_naming_what_is_missing(cluster, res, requested, match):
    with pytest.raises(ConfigError, match=match):
        plan(cluster, res, requested, 8)


def test_constants_leave_room_for_a_data_task():
    assert DATA_CPUS >= 1.0  # Ray Data map tasks ask for a whole CPU
    assert 0 < TRIAL_CPUS < 0.5


def test_a_one_worker_trial_holds_its_worker_and_a_larger_one_an_actor_beside_its_workers():
    """One worker trains in the trial actor, which holds the worker's resources; several workers
    are Ray Train's, placed by Ray Train, beside a small trial actor."""
    one = plan({"CPU": 8.0, "GPU": 2.0, "spot": 2.0}, Resources(1, 2.0, 1.0, {"spot": 1.0}), 0, 4)
    assert one.trial_resources().bundles == [{"CPU": 2.0, "GPU": 1.0, "spot": 1.0}]
    assert one.trial_total_cpus == 2.0
    two = plan({"CPU": 16.0}, Resources(2, 2.0), 0, 4)
    assert two.trial_resources().bundles == [{"CPU": TRIAL_CPUS}]
    assert two.trial_total_cpus == TRIAL_CPUS + 4.0
