"""What a sweep's trials cost, and the caps that stop a sweep from starting more of them.

Each trial logs, on its nested MLflow run, ``cost/device_seconds`` (its workers x the wall
seconds its trainable ran: GPU-seconds when the workers train on GPUs, CPU-worker-seconds on
CPUs) and ``cost/cpu_seconds`` (the process CPU time of the trial's process, user + system; a
one-worker trial trains in that process). A trial trained again after an interruption adds to
what it recorded before. The sweep's parent run sums them as ``cost/device_hours`` and
``cost/cpu_hours``, and, with a price per device-hour (``--price``), ``cost/usd``.

Caps (``--max-hours``, ``--max-device-hours``, recorded in ``sweep.json``) are read by the
searcher before each new trial: once one is reached it suggests no more; running trials finish.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher
from ray.tune.utils.util import _atomic_save, _load_newest_checkpoint

from urm_ray import redact, tracking
from urm_ray.tracking import TRIAL_TAG
from urm_ray.tune.info import SweepInfo
from urm_ray.tune.search import SweepSearch

logger = logging.getLogger(__name__)

DEVICE_SECONDS = "cost/device_seconds"
CPU_SECONDS = "cost/cpu_seconds"
SEARCH_STATE = "search_gen_state-*.json"  # Tune's saved trial generator (num_samples, finished)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def measured(tracking_uri: str, experiment: str, run_name: str, workers: int) -> Iterator[None]:
    """Time the trial trained inside and log its cost on its MLflow run ``run_name``, also when
    it stops early (pruned, failed): what it ran, it cost."""
    wall, cpu = time.monotonic(), _cpu_seconds()
    try:
        yield
    finally:
        spent = {DEVICE_SECONDS: workers * (time.monotonic() - wall), CPU_SECONDS: _cpu_seconds() - cpu}
        try:
            _add(tracking_uri, experiment, run_name, spent)
        except Exception as err:  # noqa: BLE001 (a tracking store away must not hide the trial's own error)
            logger.warning("cost of trial %s not recorded: %s", run_name, err)


def _add(tracking_uri: str, experiment: str, run_name: str, spent: dict[str, float]) -> None:
    run = tracking.Run.find(tracking_uri, experiment, run_name)
    if run is not None:  # None: failed before its run was opened
        run.accumulate(spent)  # one step per attempt of the trial (a retry, a resume)


def trial_costs(info: SweepInfo) -> dict[int, dict[str, float]]:
    """Trial number -> its recorded cost metrics."""
    runs = tracking.child_runs(info.tracking_uri, info.experiment, info.parent_run_id)
    return {int(r.tags[TRIAL_TAG]): {k: r.metrics[k] for k in (DEVICE_SECONDS, CPU_SECONDS) if k in r.metrics}
            for r in runs if TRIAL_TAG in r.tags}


def sweep_cost(info: SweepInfo, costs: dict[int, dict[str, float]]) -> dict[str, float]:
    """The sweep's totals as logged on its parent run."""
    device_s = sum(c.get(DEVICE_SECONDS, 0.0) for c in costs.values())
    total = {"cost/device_hours": device_s / 3600,
             "cost/cpu_hours": sum(c.get(CPU_SECONDS, 0.0) for c in costs.values()) / 3600}
    if info.price_per_hour:
        total["cost/usd"] = total["cost/device_hours"] * info.price_per_hour
    return total


def cap_reached(info: SweepInfo) -> str:
    """Which cap stops new trials (a sentence naming it), or "" while none is reached."""
    if info.max_hours:
        hours = info.elapsed_s() / 3600
        if hours >= info.max_hours:
            return f"--max-hours {info.max_hours:g} reached ({hours:.3g} h of wall time)"
    if info.max_device_hours:
        spent = sum(c.get(DEVICE_SECONDS, 0.0) for c in trial_costs(info).values()) / 3600
        if spent >= info.max_device_hours:
            return f"--max-device-hours {info.max_device_hours:g} reached ({spent:.3g} device-hours)"
    return ""


class CappedSearch(SweepSearch):
    """``SweepSearch`` that suggests no new trial once a cap in ``sweep.json`` is reached. The
    caps are read from the file at each suggestion, so a resume with larger caps goes on with
    the searcher Tune saved."""

    def __init__(self, *args: Any, folder: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.folder = folder

    def suggest(self, trial_id: str) -> dict | str | None:
        if trial_id not in self._ot_trials:
            info = SweepInfo.load(Path(self.folder))
            info.tracking_uri = redact.recall(info.tracking_uri)
            reached = cap_reached(info)
            if reached:
                print(f"sweep {info.name}: {reached}; no new trial starts, running ones finish", flush=True)
                return Searcher.FINISHED
        return super().suggest(trial_id)


def reopen(tune_dir: Path, trials: int) -> None:
    """Let Tune's saved trial generator make trials again, up to ``trials`` in all: it saved the
    total it was created with, and "finished" once it reached it or a cap stopped the searcher."""
    state = _load_newest_checkpoint(str(tune_dir), SEARCH_STATE)
    if not state:
        return
    state.update(total_samples=trials, finished=False)
    newest = max(tune_dir.glob(SEARCH_STATE))  # the file Tune reads back: the last by name
    _atomic_save(state, str(tune_dir), newest.name, f"tmp-{newest.name}")
