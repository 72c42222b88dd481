"""Where a sweep's trial trains, seen from the run's session (``train.session``).

A one-worker trial trains in its Tune trial actor (``TrialHost``): Tune persists its checkpoints
in the trial's folder and hands the latest back (``tune.get_checkpoint``) when it retries or
resumes the trial. A trial of several workers trains in Ray Train's workers and reaches Tune
through Ray Train callbacks. Either way the sweep, not the session, decides how the trial ended
(its fate): ``in_sweep`` gives the session the hook that says whether that is already recorded.
Ray Tune is imported here, never in train/: every Ray Train worker loads train/ and needs none
of it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray.train
import ray.tune
import torch

from urm_ray.tracking import FATE_TAG
from urm_ray.train import hosts
from urm_ray.train.session import InSweep
from urm_ray.train.step import local_device

# a report as Tune should see it (with a sweep's derived metrics), or None to keep it out of Tune;
# the flag: whether it carries a checkpoint
TuneFilter = Callable[[dict[str, Any], bool], dict[str, Any] | None]


class TrialHost:
    """A Tune trial actor, one worker."""

    rank, world = 0, 1

    def __init__(self, datasets: dict[str, Any], to_tune: TuneFilter, device: str) -> None:
        self.datasets, self.to_tune, self._device = datasets, to_tune, device
        self._reported: dict[str, Any] = {}

    def device(self) -> torch.device:
        return local_device(self._device)

    def latest(self) -> ray.train.Checkpoint | None:
        return ray.tune.get_checkpoint()

    def reported(self) -> dict[str, Any]:
        return self._reported

    def shard(self, name: str) -> Any:
        return self.datasets[name]

    def saved_state(self) -> dict[str, Any] | None:
        return hosts.load(self.latest())

    def report(self, metrics: dict[str, Any], folder: Path | None, step: int) -> None:
        if folder is not None:
            self._reported = metrics
        shown = self.to_tune(metrics, folder is not None)
        if shown is None:
            return
        ckpt = None if folder is None else ray.tune.Checkpoint.from_directory(str(folder))
        ray.tune.report(shown, checkpoint=ckpt)


def fate_recorded(tags: dict[str, str]) -> bool:
    """Whether the sweep already recorded how the trial ended (e.g. pruned, its run KILLED): a
    trial its scheduler stopped is interrupted too, and that record stands."""
    return FATE_TAG in tags


def in_sweep(to_tune: TuneFilter, callbacks: list[Any] | None = None) -> InSweep:
    """What a sweep's trial adds to its run's session: the one-worker host (reporting through
    ``to_tune``), the Ray Train ``callbacks`` of a trial on several workers, the fate hook."""
    return InSweep(lambda datasets, device: TrialHost(datasets, to_tune, device), callbacks or [],
                   fate_recorded)
