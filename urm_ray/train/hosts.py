"""Where the training loop runs: what it reads, where it reports and where checkpoints go.

The one loop (``loop.run_loop``) asks its host for its device, the dataset shards, the state
saved by the latest checkpoint, and to report metrics with rank 0's checkpoint folder; the run's
session (``session.Session``) asks it for the latest checkpoint and what was reported with it.
Three hosts:

    WorkerHost   a Ray Train worker (one of N DDP ranks): shards and checkpoints through Ray Train
    ProcessHost  the command's own process (one worker): checkpoints in the run's local folder
    TrialHost    a Ray Tune trial actor (one worker): checkpoints through ``tune.report``, resumed
                 from ``tune.get_checkpoint()``; in ``urm_ray.tune.trial_host``, since train/
                 imports no Ray Tune
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import ray.train

from urm_ray.train import checkpoint

if TYPE_CHECKING:
    import torch


class Host(Protocol):
    rank: int
    world: int

    def device(self) -> torch.device:
        """Where this rank's model and batches live."""

    def latest(self) -> ray.train.Checkpoint | None:
        """The run's latest checkpoint (None: none yet)."""

    def reported(self) -> dict[str, Any]:
        """The metrics reported with ``latest()`` by this host ({}: none, or not kept here)."""

    def shard(self, name: str) -> Any:
        """The "train" data: a Ray Dataset or this rank's Ray Train shard."""

    def saved_state(self) -> dict[str, Any] | None:
        """The state of the run's latest checkpoint (None: the run starts afresh)."""

    def report(self, metrics: dict[str, Any], folder: Path | None, step: int) -> None:
        """Report ``metrics`` with the checkpoint written in ``folder`` (rank 0; None: none)."""


def load(ckpt: ray.train.Checkpoint | None) -> dict[str, Any] | None:
    """The state of ``ckpt``, or of the newest earlier checkpoint beside it when it does not read
    whole (``checkpoint.load_newest``). Ray Train writes through ``checkpoint.upload``, but Tune
    copies a one-worker trial's checkpoint file by file and flushes nothing; either registers a
    checkpoint only once its copy returned, so the fallback is for what a crash of the machine
    loses, or for storage that was damaged later."""
    if ckpt is None:
        return None
    fs = ckpt.filesystem
    found = checkpoint.load_newest([*checkpoint.earlier(fs, ckpt.path), ckpt.path],
                                   lambda path: _read(fs, path))
    return None if found is None else found[1]


def _read(fs: Any, path: str) -> dict[str, Any]:
    shown = path if fs.type_name == "local" else f"{fs.type_name}://{path}"
    with ray.train.Checkpoint(path, filesystem=fs).as_directory() as folder:
        return checkpoint.load_state(Path(folder), shown)


class WorkerHost:
    """A Ray Train worker: every rank reports at the same steps (``ray.train.report`` is a
    barrier); rank 0's checkpoint reaches the run's storage whole or not at all."""

    def __init__(self) -> None:
        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()

    def device(self) -> torch.device:
        import ray.train.torch

        return ray.train.torch.get_device()

    def latest(self) -> ray.train.Checkpoint | None:
        return ray.train.get_checkpoint()

    def reported(self) -> dict[str, Any]:
        return {}  # Ray Train's result holds them, on the driver

    def shard(self, name: str) -> Any:
        return ray.train.get_dataset_shard(name)

    def saved_state(self) -> dict[str, Any] | None:
        return load(ray.train.get_checkpoint())

    def report(self, metrics: dict[str, Any], folder: Path | None, step: int) -> None:
        if folder is None:
            ray.train.report(metrics)
            return
        ckpt = ray.train.Checkpoint.from_directory(str(folder)) if self.rank == 0 else None
        ray.train.report(metrics, checkpoint=ckpt,
                         checkpoint_upload_fn=lambda ckpt, name: _upload(ckpt, name, step))


def _upload(ckpt: ray.train.Checkpoint, name: str, step: int) -> ray.train.Checkpoint:
    """Ray Train's checkpoint upload, made atomic (``checkpoint.upload``)."""
    storage = ray.train.get_context().get_storage()
    dest = storage.build_checkpoint_path_from_name(name)
    checkpoint.upload(Path(ckpt.path), storage.storage_filesystem, dest, step)
    return ray.train.Checkpoint(dest, filesystem=storage.storage_filesystem)


class ProcessHost:
    """The command's own process, one worker: checkpoints go to ``run_folder`` with Ray Train's
    naming (``checkpoint_<time>``), so a run resumes from either host's checkpoints."""

    rank, world = 0, 1

    def __init__(self, datasets: dict[str, Any], run_folder: Path, keep: int, device: str = "cpu") -> None:
        self.datasets, self.run_folder, self.keep, self._device = datasets, run_folder, keep, device
        self._latest: Path | None = checkpoint.latest_local(run_folder)
        self._reported: dict[str, Any] = {}

    def device(self) -> torch.device:
        from urm_ray.train.step import local_device

        return local_device(self._device)

    def latest(self) -> ray.train.Checkpoint | None:
        return None if self._latest is None else ray.train.Checkpoint(str(self._latest))

    def reported(self) -> dict[str, Any]:
        return self._reported

    def shard(self, name: str) -> Any:
        return self.datasets[name]

    def saved_state(self) -> dict[str, Any] | None:
        found = checkpoint.load_newest(checkpoint.saved_local(self.run_folder), checkpoint.load_state)
        if found is None:
            return None
        self._latest, state = found
        return state

    def report(self, metrics: dict[str, Any], folder: Path | None, step: int) -> None:
        if folder is not None:
            self._latest = checkpoint.persist_local(folder, self.run_folder, step, self.keep)
            self._reported = metrics
