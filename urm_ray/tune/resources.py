"""Resource plan of a sweep: CPU/GPU shares of trials, workers and Ray Data, and concurrency.

A one-worker trial trains in its Tune trial actor, which holds the worker's resources. A trial
of several workers is a Tune actor that only waits on its Ray Train controller (a small CPU
share, ``TRIAL_CPUS``) plus ``workers`` Ray Train workers. Ray Data's map tasks ask for one whole
CPU each (Ray's default) and run between worker steps, so one CPU (``DATA_CPUS``) is kept out of
the trials' reach; without it the trials hold every CPU, the data tasks wait, and the sweep
hangs. So, with C CPUs and G GPUs:

    concurrency * trial CPUs                 <= C - DATA_CPUS
    concurrency * workers * gpus_per_worker  <= G

where a trial's CPUs are cpus_per_worker (one worker) or TRIAL_CPUS + workers * cpus_per_worker.

A space whose single trial does not fit fails here, saying what is missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ray import tune

from urm_ray.errors import ConfigError
from urm_ray.tune.space import Resources

TRIAL_CPUS = 0.1  # the Tune trial actor: builds the trainer, then waits on it
DATA_CPUS = 1.0  # one Ray Data map task (num_cpus=1 by default), shared by all trials
_EPS = 1e-9  # float slack: 2 * 0.45 + 0.1 must count as <= 1.0
RESOURCE_KEYS = ("resources.num_workers", "resources.cpus_per_worker", "resources.gpus_per_worker",
                 "resources.device", "resources.torch_threads")  # and resources.worker_resources.*


@dataclass(frozen=True)
class Plan:
    workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    trial_cpus: float
    concurrency: int
    torch_threads: int  # intra-op threads per worker: the CPUs a worker really gets
    custom: tuple[tuple[str, float], ...] = ()  # custom Ray resources per worker

    @property
    def trial_total_cpus(self) -> float:
        return trial_cpus(self.workers, self.cpus_per_worker)

    def trial_resources(self) -> tune.PlacementGroupFactory:
        """What Tune reserves for one trial: the worker itself (one worker, trained in the trial
        actor), or the trial actor and its Ray Train workers (placed by Ray Train)."""
        if self.workers == 1:
            bundle = {"CPU": self.cpus_per_worker, **dict(self.custom)}
            if self.gpus_per_worker:
                bundle["GPU"] = self.gpus_per_worker
            return tune.PlacementGroupFactory([bundle])
        return tune.PlacementGroupFactory([{"CPU": TRIAL_CPUS}])

    def train_overrides(self) -> dict[str, object]:
        """Dotted config keys every trial gets from the plan (each one ``is_resource_key``)."""
        return {
            "resources.num_workers": self.workers,
            "resources.cpus_per_worker": self.cpus_per_worker,
            "resources.gpus_per_worker": self.gpus_per_worker or 1.0,
            "resources.device": "cuda" if self.gpus_per_worker else "cpu",
            "resources.torch_threads": self.torch_threads,
            **{f"resources.worker_resources.{name}": amount for name, amount in self.custom},
        }

    def describe(self, cluster: dict[str, float]) -> str:
        gpu = f", {self.workers * self.gpus_per_worker:g} GPU" if self.gpus_per_worker else ""
        where = ("trained in the trial actor" if self.workers == 1
                 else f"+ {self.trial_cpus:g} CPU for the trial actor")
        return (f"{self.concurrency} concurrent trial(s), each {self.workers} worker(s) x "
                f"{self.cpus_per_worker:g} CPU{gpu} ({where}); {DATA_CPUS:g} CPU left for Ray Data; "
                f"cluster: {cluster.get('CPU', 0):g} CPU, {cluster.get('GPU', 0):g} GPU")


def plan(cluster: dict[str, float], res: Resources, requested: int, trials: int) -> Plan:
    """The plan for ``requested`` concurrent trials (0 = as many as fit, at most ``trials``)."""
    cpus, gpus = cluster.get("CPU", 0.0), cluster.get("GPU", 0.0)
    per_trial_cpu = trial_cpus(res.workers, res.cpus_per_worker)
    per_trial_gpu = res.workers * res.gpus_per_worker
    fit_cpu = math.floor((cpus - DATA_CPUS + _EPS) / per_trial_cpu) if cpus > DATA_CPUS else 0
    fit_gpu = math.floor((gpus + _EPS) / per_trial_gpu) if per_trial_gpu else fit_cpu
    fits = min(fit_cpu, fit_gpu)
    for name, amount in res.custom.items():  # e.g. one "spot_gpu" per node: one worker per node
        fits = min(fits, math.floor((cluster.get(name, 0.0) + _EPS) / (res.workers * amount)))
    if fits < 1:
        raise ConfigError(_missing(cluster, res, per_trial_cpu, per_trial_gpu))
    custom = tuple(sorted((name, float(amount)) for name, amount in res.custom.items()))
    if requested > fits:
        raise ConfigError(
            f"concurrency={requested} needs {requested * per_trial_cpu + DATA_CPUS:g} CPUs"
            + (f" and {requested * per_trial_gpu:g} GPUs" if per_trial_gpu else "")
            + f"; the cluster has {cpus:g} CPUs, {gpus:g} GPUs: at most {fits} trial(s) fit"
        )
    concurrency = min(requested or fits, trials)
    threads = max(1, math.floor((cpus - DATA_CPUS) / (concurrency * res.workers) + _EPS))
    if not res.gpus_per_worker:
        threads = min(threads, max(1, math.ceil(res.cpus_per_worker)))
    return Plan(res.workers, res.cpus_per_worker, res.gpus_per_worker, TRIAL_CPUS, concurrency,
                threads, custom)


def trial_cpus(workers: int, cpus_per_worker: float) -> float:
    """The CPUs one trial holds: its worker's in the trial actor, or the actor's and its workers'."""
    return cpus_per_worker if workers == 1 else TRIAL_CPUS + workers * cpus_per_worker


def is_resource_key(key: str) -> bool:
    """Whether a dotted key is one the plan sets: where a trial runs on the sweep's cluster, not
    part of the config that won, so the best config and final training leave it out."""
    return key in RESOURCE_KEYS or key.startswith("resources.worker_resources.")


def without_resources(overrides: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in overrides.items() if not is_resource_key(k)}


def trial_bundles(res: Resources, trials: int) -> list[dict[str, float]]:
    """What ``trials`` concurrent trials ask of the cluster, as autoscaler bundles (one per actor)."""
    worker = {"CPU": res.cpus_per_worker, "GPU": res.gpus_per_worker, **res.custom}
    actor = [] if res.workers == 1 else [{"CPU": TRIAL_CPUS}]
    return [{"CPU": DATA_CPUS}] + trials * (actor + res.workers * [dict(worker)])


def _missing(cluster: dict[str, float], res: Resources, cpu: float, gpu: float) -> str:
    cpus, gpus = cluster.get("CPU", 0.0), cluster.get("GPU", 0.0)
    for name, amount in res.custom.items():
        if res.workers * amount > cluster.get(name, 0.0):
            return (f"one trial needs {res.workers * amount:g} {name} (resources.workers={res.workers}"
                    f" x resources.custom.{name}={amount:g}); the cluster has {cluster.get(name, 0.0):g}")
    if gpu > gpus:
        return (f"one trial needs {gpu:g} GPUs (resources.workers={res.workers} x "
                f"resources.gpus_per_worker={res.gpus_per_worker:g}); the cluster has {gpus:g}")
    actor = "" if res.workers == 1 else f"{TRIAL_CPUS:g} for the trial actor + "
    return (f"one trial needs {cpu + DATA_CPUS:g} CPUs ({actor}"
            f"resources.workers={res.workers} x resources.cpus_per_worker={res.cpus_per_worker:g}"
            f" + {DATA_CPUS:g} kept for Ray Data); the cluster has {cpus:g}: "
            f"{cpu + DATA_CPUS - cpus:g} CPU missing")
