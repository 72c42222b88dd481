"""Resuming a run without corrupting it: what a resume may change, and one driver per run.

Reusing ``train.run_name`` resumes the run from its latest checkpoint. Two guards, both before
Ray starts, refuse what would corrupt it:

    check(cfg)                  # ConfigError: a key outside RESUMABLE differs from the checkpoint's
    with locked(cfg):           # ConfigError: another process holds the run's local lock
        ...                     # train; the lock is held until the block ends

``check`` compares the resolved config with ``config.yaml`` in the run's newest complete
checkpoint (local, or read through pyarrow's filesystem on S3). Only the keys of ``RESUMABLE``
may differ: how long, how often, on what resources and where things are recorded. Anything else
(model, data, optimizer, objective, seeds, precision, evaluation) would load the saved state into
a different run, or log numbers that no longer mean the same thing, so every differing key is
named with its saved and new value.

One driver per run: on local storage the driver holds an exclusive ``flock`` on
``<storage>/<run>/.lock`` for the run's life (the system releases it when the process ends, however
it ends), with its host and pid written in it. On any storage, the run's session refuses a RUNNING
MLflow run whose heartbeat is fresh (``heartbeat.check_reopen``), in the run's record read back
while Ray started.

``resumed_tags`` keeps MLflow in step with a resume: params are immutable, so a config value that
differs from the run's param is set as the tag ``urm_ray.resumed.<key>``.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.fs
import yaml

from urm_ray import heartbeat, redact, tracking
from urm_ray.config import UNSET, RunConfig, differences, renamed
from urm_ray.errors import ConfigError
from urm_ray.tracking import DRIVER_TAG, RESUMED_TAG_PREFIX
from urm_ray.train.checkpoint import CONFIG_FILE, STATE_FILE

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
# The keys a resume may change, and why each is safe (docs/training.md#resume-a-run).
RESUMABLE = {
    "train.steps": "the run's length; the learning-rate schedule follows the new total",
    "train.log_every": "logging cadence",
    "eval.every": "evaluation cadence",
    "checkpoint.every": "checkpoint cadence",
    "checkpoint.keep": "how many checkpoints are kept",
    "eval.batch_size": "how evaluation is batched, not what it scores",
    "resources.num_workers": "a checkpoint holds each rank's state; a rank it lacks gets a fresh seed",
    "resources.cpus_per_worker": "resources",
    "resources.gpus_per_worker": "resources",
    "resources.worker_resources": "resources",
    "resources.torch_threads": "threads",
    "resources.in_process": "either host writes and reads the same checkpoints",
    "resources.max_failures": "restarts after a crash",
    "checkpoint.storage_path": "where the checkpoints are (a moved folder)",
    "tracking.enabled": "where the run is recorded",
    "tracking.experiment": "where the run is recorded",
    "tracking.tracking_uri": "where the run is recorded",
    "tracking.log_checkpoint": "whether the final checkpoint is uploaded",
}


def resumable(key: str) -> bool:
    section = key.rpartition(".")[0]  # resources.worker_resources.<name>
    return key in RESUMABLE or section in RESUMABLE


# --- the config a resume may change -------------------------------------------------------------


def saved_config(storage_path: str, run_name: str) -> tuple[str, dict[str, Any]] | None:
    """(folder, config) of the run's newest complete checkpoint whose ``config.yaml`` reads;
    None: the run has none, it starts afresh. Local folders and s3:// alike, through pyarrow."""
    if "://" in storage_path:
        fs, root = pyarrow.fs.FileSystem.from_uri(storage_path)
        scheme = f"{fs.type_name}://"
    else:
        fs, root, scheme = pyarrow.fs.LocalFileSystem(), storage_path, ""
    selector = pyarrow.fs.FileSelector(f"{root.rstrip('/')}/{run_name}", allow_not_found=True)
    folders = sorted(info.path for info in fs.get_file_info(selector)
                     if info.type == pyarrow.fs.FileType.Directory
                     and info.base_name.startswith("checkpoint_2"))
    for folder in reversed(folders):
        if fs.get_file_info(f"{folder}/{STATE_FILE}").type != pyarrow.fs.FileType.File:
            continue  # incomplete: state.pt is written last
        try:
            with fs.open_input_stream(f"{folder}/{CONFIG_FILE}") as stream:
                data = yaml.safe_load(stream.read())
        except (OSError, pyarrow.ArrowException, yaml.YAMLError) as err:
            logger.warning("%s%s/%s unreadable (%s): comparing with an older checkpoint",
                           scheme, folder, CONFIG_FILE, err)
            continue
        if isinstance(data, dict):  # written before a rename: its keys under their new names
            return f"{scheme}{folder}", renamed(data)
    return None


def check(cfg: RunConfig) -> None:
    """Refuse the resume of a resolved config that differs from its checkpoint's beyond
    ``RESUMABLE``, naming each key with both values and how to go on. A new run passes."""
    found = saved_config(cfg.checkpoint.storage_path, cfg.train.run_name)
    if found is None:
        return
    where, saved = found
    try:
        changed = differences(saved, cfg)
    except ConfigError as err:
        raise ConfigError(f"train.run_name={cfg.train.run_name}: the config of its checkpoint "
                          f"{where} does not load ({err}); start a new run with another "
                          "train.run_name") from err
    refused = {key: pair for key, pair in changed.items() if not resumable(key)}
    if not refused:
        return
    keys = sorted(refused)
    listed = "; ".join(f"{key}: saved {_text(refused[key][0])}, now {_text(refused[key][1])}"
                       for key in keys)
    restore = " ".join(f"{key}={_text(refused[key][0])}" for key in keys if refused[key][0] is not UNSET)
    raise ConfigError(
        f"train.run_name={cfg.train.run_name} resumes from {where}, whose config differs in {listed}. "
        "A resume may change only its length, cadences, resources and tracking (the keys listed in "
        "docs/training.md, Resume a run). Start a new run with another "
        f"train.run_name, or pass the saved values: {restore}")


def _text(value: Any) -> str:
    """A value as an override writes it (``model.hidden_size=16``)."""
    if value is UNSET:
        return "(not set)"
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    return text.removesuffix("...").strip()


# --- one driver per run -------------------------------------------------------------------------


@contextmanager
def locked(cfg: RunConfig) -> Iterator[None]:
    """Hold the run's exclusive ``flock`` on ``<storage>/<run>/.lock`` while the block runs, or
    refuse it with ConfigError (nothing on remote storage). The file stays after the run: removing
    it would let two processes lock two different files."""
    if "://" in cfg.checkpoint.storage_path:
        yield
        return
    folder = Path(cfg.checkpoint.storage_path) / cfg.train.run_name
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
            held = f" (it holds {folder / LOCK_FILE})"
            raise ConfigError(heartbeat.busy(cfg.train.run_name, holder, held=held)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{heartbeat.this_driver()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


# --- MLflow after a resume ----------------------------------------------------------------------


def resumed_tags(previous: tracking.RunSummary | None, values: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The tags to set on the run a driver (re)opens: this driver (``urm_ray.driver``) and every
    config value (``values``: the flattened config) that now differs from the param ``previous``
    recorded (``urm_ray.resumed.<key>``); and the resumed tags to drop, that match again.
    ``previous``: the run before it was reopened (None: a new run)."""
    params = {} if previous is None else previous.params
    texts = {key: _param_text(value) for key, value in values.items()}
    changed = {f"{RESUMED_TAG_PREFIX}{key}": value for key, value in texts.items()
               if key in params and params[key] != value}
    for tag, value in changed.items():
        logger.info("resumed with %s=%s (MLflow param: %s)", tag[len(RESUMED_TAG_PREFIX):], value,
                    params[tag[len(RESUMED_TAG_PREFIX):]])
    stale = [] if previous is None else [tag for tag in previous.tags
                                         if tag.startswith(RESUMED_TAG_PREFIX) and tag not in changed]
    return {DRIVER_TAG: heartbeat.this_driver(), **changed}, stale


def _param_text(value: Any) -> str:
    """A config value as MLflow's params record it (``tracking.open_run``)."""
    return redact.strip(str(list(value) if isinstance(value, tuple) else value))
