"""Which Ray cluster a command runs on, and growing an autoscaling cluster before a run is planned
against it.

``init_ray`` joins the cluster named by ``$RAY_ADDRESS`` or starts a private local instance (never
one that another user started with ``ray start`` on the same machine), quiet unless ``verbose``.

On a cluster from ``cluster/gpu.yaml`` the GPU node types start at zero nodes, so a sweep or a
training run that sized itself from ``ray.cluster_resources()`` would find no GPU and stop. With
``--scale-up SECONDS`` (``urm-ray train/sweep/final``) the resources the run needs are first asked
of the Ray autoscaler (``ray.autoscaler.sdk.request_resources``) and waited for; the request is
withdrawn when the run ends, so idle nodes are released again.

On a cluster of several nodes, ``check_reachable`` refuses a run or sweep whose data or
checkpoints would be on one node's own disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator

import ray
import ray.data  # noqa: F401  (configures the ray.data logger, which init_ray then sets)

from urm_ray.errors import ConfigError

Bundle = dict[str, float]
log = logging.getLogger(__name__)

# How often Ray Train's controller polls its workers, in seconds. The end of training is seen at
# the next poll, so Ray's slower default adds worker teardown time to every run and sweep trial
# (docs/experiments/run-overhead.md); a poll is one small RPC per worker.
HEALTH_CHECK_INTERVAL_S = "0.2"

_private_gcs: str | None = None  # the GCS address of the private instance init_ray started


def init_ray(num_cpus: int | None = None, verbose: bool = False, dashboard: bool = True) -> None:
    """Join the cluster named by $RAY_ADDRESS, or start a private local Ray instance (also for
    ``RAY_ADDRESS=local``, which names no cluster).

    The local instance's dashboard gets a fixed port, and every Ray process inherits
    RAY_API_SERVER_ADDRESS pointing at it. Train V2's placement-group cleaner (which frees the
    workers of a run, or of a trial Tune stopped) queries the State API without an address; with
    several Ray instances on one machine it cannot tell which is its own, prints a traceback and
    gives up, and a stopped trial's CPUs stay reserved until the sweep deadlocks. A private
    instance for a run that trains in this process needs no State API (``dashboard=False``): one
    second less to start here, and a dozen dashboard processes fewer competing with training.

    Quiet (``verbose=False``): the output of Ray's workers, actors and raylet stays in Ray's log
    files (``/tmp/ray/session_latest/logs``) instead of reaching this terminal, and the driver's
    ``ray`` loggers show errors only (Ray Data's too, which sets its own level when imported).
    """
    global _private_gcs
    if not verbose:
        logging.getLogger("ray.data").setLevel(logging.ERROR)
    # The driver prints the raylet's warnings ("(raylet) N PYTHON worker processes have been
    # started ... the maximum expected startup concurrency", many per sweep on a small machine)
    # whatever log_to_driver says; they stay in the raylet's log. The flag is Ray's own switch
    # for this output (its debugger turns it off at a breakpoint).
    ray._private.worker._worker_logs_enabled = verbose
    quiet = {"log_to_driver": verbose, "logging_level": logging.INFO if verbose else logging.ERROR}
    if os.environ.get("RAY_ADDRESS", "local") != "local":
        log.info("joining Ray at %s", os.environ["RAY_ADDRESS"])
        ray.init(**quiet)
        return
    log.info("starting Ray (a private local instance)")
    # Nothing preempts a private instance's only node: skip Train's preemption-watcher actor (one
    # more process to start on every run). Set before ray.init, so every Ray process inherits it.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    if not dashboard:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **quiet)
        _private_gcs = ray.get_runtime_context().gcs_address
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
    ray.init(address="local", num_cpus=num_cpus, dashboard_port=port, **quiet)
    _private_gcs = ray.get_runtime_context().gcs_address


def on_private_instance() -> bool:
    """Whether this process runs on the private local Ray instance it started (``init_ray``): one
    machine, this one, so a single worker may as well run here (``session.runs_in_process``)."""
    return ray.is_initialized() and ray.get_runtime_context().gcs_address == _private_gcs


def ray_train_defaults() -> None:
    """Ray Train settings for the ``TorchTrainer`` this process builds next, unless the user set
    them: Ray passes them from this process's environment to the run's controller and workers."""
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", HEALTH_CHECK_INTERVAL_S)


def node_count() -> int:
    """Alive nodes of the Ray cluster this process joined."""
    return sum(1 for node in ray.nodes() if node.get("Alive"))


def check_reachable(places: dict[str, tuple[str, str]], shared_fs: bool, grows: bool = False) -> None:
    """Refuse, before any work, a local path that other nodes would need: on a cluster of more
    than one node (or one that ``--scale-up`` is about to grow, ``grows``) a worker or trial on
    another node cannot read this node's disk, and what it writes there is lost with its node.

    ``places``: config key -> (its value, what lives there); ``shared_fs``: the user declared
    that every node mounts this machine's folders at the same paths (``resources.shared_fs``)."""
    if shared_fs:
        return
    nodes = node_count()
    if nodes <= 1 and not grows:
        return
    cluster = f"the cluster has {nodes} nodes" + (" and --scale-up adds more" if grows else "")
    for key, (value, what) in places.items():
        if "://" not in value:
            raise ConfigError(
                f"{key}={value}: {what} would be on this node's disk, which the other nodes cannot "
                f"reach ({cluster}); expected an s3://bucket/prefix URL (a custom endpoint from "
                f"$AWS_ENDPOINT_URL), or resources.shared_fs=true if every node mounts {value} at that "
                "path (NFS, EFS)")


def holds(cluster: dict[str, float], bundles: list[Bundle]) -> bool:
    """Whether the cluster's totals cover the bundles' sums (per resource)."""
    need: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            need[name] = need.get(name, 0.0) + amount
    return all(cluster.get(name, 0.0) + 1e-9 >= amount for name, amount in need.items())


@contextlib.contextmanager
def scaled_up(bundles: list[Bundle], timeout_s: float, poll_s: float = 5.0,
              request: Callable[..., None] | None = None) -> Iterator[None]:
    """Ask the autoscaler for ``bundles``, wait until the cluster holds them, withdraw at exit.

    ``timeout_s`` = 0 does nothing (a fixed cluster, a laptop). Raises ``ConfigError`` naming
    what is missing when the nodes have not come up in time.
    """
    if timeout_s <= 0:
        yield
        return
    if request is None:
        from ray.autoscaler.sdk import request_resources as request
    bundles = [{k: v for k, v in b.items() if v > 0} for b in bundles]
    request(bundles=bundles)
    try:
        _wait(bundles, timeout_s, poll_s)
        yield
    finally:
        request(bundles=[])  # withdraw: idle nodes time out and are released


def _wait(bundles: list[Bundle], timeout_s: float, poll_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not holds(ray.cluster_resources(), bundles):
        if time.monotonic() > deadline:
            raise ConfigError(
                f"the cluster did not grow to hold {bundles} within --scale-up {timeout_s:g} s; "
                f"it has {ray.cluster_resources()} (see `ray status` and the autoscaler log: "
                "quotas, spot capacity, node types in cluster/gpu.yaml)"
            )
        log.info("waiting for the autoscaler: need %s, have %s", bundles, ray.cluster_resources())
        time.sleep(poll_s)
