"""Training checkpoints: everything needed to rebuild and resume a run from one folder.

A checkpoint folder holds ``state.pt`` (model, EMA, optimizers, step, data position, and per
rank the RNG states and the ACT carry) and ``config.yaml`` (the resolved run config), so
``urm-ray eval`` and resume need nothing else. With the per-rank state a resumed run continues
exactly as the uninterrupted run would have (bit for bit on CPU): the rows in flight keep their
recurrent state and the random draws (ACT exploration, GRAM's noise) repeat.

A checkpoint reaches ``checkpoint.storage_path`` whole or not at all (``upload``): on a local disk it
is written under a hidden temporary name (``.partial-<name>``), flushed to the disk and renamed
at the end, so a crash or power loss at any moment leaves the folder whole or absent; the
temporary folders a crash left are removed by the run's next write. On object storage, where
each object appears only once complete, ``state.pt`` goes last. A failed write (a full disk,
lost credentials) removes what it wrote and names the step and the destination.

``state.pt`` is read as data, never as code (``load_state``): tensors, containers of them and
plain Python values, plus the two kinds of object that older checkpoints pickled (numpy's RNG
state and the ACT carry's dataclass). A file that asks for anything else (a crafted pickle
that would run a command) is refused unread with ``CheckpointRefused``. Resuming reads the
newest checkpoint that loads whole (``load_newest``): one that does not is passed over, with a
warning naming it.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import shutil
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow
import pyarrow.fs
import torch

from urm_ray import redact
from urm_ray.errors import CheckpointError, CheckpointRefused, CheckpointWriteError, DataError
from urm_ray.models.act import ACTCarry

logger = logging.getLogger(__name__)

STATE_FILE = "state.pt"
CONFIG_FILE = "config.yaml"
PARTIAL = ".partial-"  # the prefix of a local checkpoint folder being written
# Ray Train's checkpoint_<time> and Tune's checkpoint_<index>: both sort oldest first by name
SAVED_NAME = re.compile(r"checkpoint_\d")

_reconstruct = np.ndarray(0).__reduce__()[0]  # numpy's array unpickler, wherever it lives
# What a state.pt written before the carry and numpy's RNG state were saved as tensors pickles
# besides tensors, containers and plain values: numpy's legacy RNG tuple (a uint32 array) and the
# ACT carry's dataclass. Allowed only while a state.pt is read; nothing else is.
_OLDER_FORMAT: list[Any] = [
    ACTCarry,
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
    _reconstruct,
    (_reconstruct, "numpy.core.multiarray._reconstruct"),  # its name in a file numpy 1 wrote
]

Folder = TypeVar("Folder", Path, str)


@dataclass
class Position:
    """Where training stands: optimizer steps done and the data position (epoch, batch)."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # batches of ``epoch`` already consumed


def rank_seed(seed: int, rank: int) -> int:
    """A distinct, reproducible seed per DDP rank (ranks draw different exploration and noise)."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def rng_state() -> dict[str, Any]:
    """This process's RNG states, as tensors and plain values."""
    numpy = np.random.get_state(legacy=False)  # MT19937: {"key": uint32 [624], "pos": int}, gauss
    numpy["state"]["key"] = torch.from_numpy(numpy["state"]["key"].astype(np.int64))
    state = {"python": random.getstate(), "numpy": numpy, "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    numpy = state["numpy"]
    if isinstance(numpy, dict):  # else numpy's legacy tuple, as older checkpoints hold it
        key = np.asarray(numpy["state"]["key"].numpy(), dtype=np.uint32)
        numpy = {**numpy, "state": {**numpy["state"], "key": key}}
    np.random.set_state(numpy)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def rank_state(carry: ACTCarry | None) -> dict[str, Any]:
    """What one rank contributes to a checkpoint: its RNG states and its ACT carry (on the CPU,
    as a dict of its fields, so reading it back needs no class)."""
    if carry is None:
        return {"rng": rng_state(), "carry": None}
    cpu = carry.to("cpu")
    return {"rng": rng_state(), "carry": {f.name: getattr(cpu, f.name) for f in fields(cpu)}}


def save(
    folder: Path,
    model: torch.nn.Module,
    ema: Any | None,
    optimizers: list[Any],
    position: Position,
    config: dict[str, Any],
    ranks: list[dict[str, Any]] | None = None,
) -> None:
    """Write ``state.pt`` and ``config.yaml`` into ``folder`` (which must exist). ``ranks``: every
    rank's ``rank_state``, in rank order (default: this process's, with no carry)."""
    state = {
        "model": model.state_dict(),
        "ema": ema.state_dict() if ema is not None else None,
        "optimizers": [opt.state_dict() for opt in optimizers],
        "position": vars(position),
        "ranks": ranks if ranks is not None else [rank_state(None)],
    }
    torch.save(state, folder / STATE_FILE)
    # imported here, not at the top: the training step (step.py) imports this module on machines
    # that may lack PyYAML
    import yaml

    (folder / CONFIG_FILE).write_text(yaml.safe_dump(redact.strip(config), sort_keys=False))


def upload(source: Path, fs: pyarrow.fs.FileSystem, dest: str, step: int) -> None:
    """Copy the checkpoint folder ``source`` to ``dest`` on ``fs`` so that ``dest`` then holds
    the whole checkpoint or nothing: see the module docstring. Raises ``CheckpointWriteError``."""
    parent, _, name = dest.rstrip("/").rpartition("/")
    local = fs.type_name == "local"  # a rename is atomic there; on object storage it is a copy
    target = f"{parent}/{PARTIAL}{name}" if local else dest
    files = sorted(source.iterdir(), key=lambda path: (path.name == STATE_FILE, path.name))
    try:
        if local:
            remove_partials(Path(parent))
            _write_durably(files, Path(target), Path(dest))
            return
        fs.create_dir(target)
        for path in files:
            with path.open("rb") as src, fs.open_output_stream(f"{target}/{path.name}") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    except (OSError, pyarrow.ArrowException) as err:
        with suppress(OSError, pyarrow.ArrowException):
            fs.delete_dir(target)
        raise CheckpointWriteError(f"the checkpoint of step {step} could not be written to {dest} "
                                   f"({err}); nothing of it was kept there") from err


def _write_durably(files: list[Path], target: Path, dest: Path) -> None:
    """Copy ``files`` into a new folder ``target`` and rename it ``dest``. Each file and the
    folder reach the disk before the rename (else a power loss could leave ``dest`` renamed but
    its files short), and the parent folder after it (else the rename itself could be lost)."""
    target.mkdir(parents=True)
    for path in files:
        with path.open("rb") as src, (target / path.name).open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
    _fsync_folder(target)
    target.rename(dest)
    try:
        _fsync_folder(dest.parent)
    except OSError:
        shutil.rmtree(dest, ignore_errors=True)  # not known to be on the disk: keep none of it
        raise


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_partials(run_folder: Path) -> None:
    """Remove the temporary folders of checkpoint writes a crash cut short in ``run_folder`` (one
    writer per run: a write in progress is this process's own, started after this)."""
    for stale in run_folder.glob(f"{PARTIAL}*"):
        logger.info("removing %s, a checkpoint write that did not finish", stale)
        shutil.rmtree(stale, ignore_errors=True)


def saved_local(run_folder: Path) -> list[Path]:
    """A run's complete checkpoint folders on local storage (``checkpoint_<time>``), oldest first."""
    return sorted(p for p in run_folder.glob("checkpoint_2*") if (p / STATE_FILE).is_file())


def latest_local(run_folder: Path) -> Path | None:
    """The newest complete checkpoint folder of a run on local storage (``checkpoint_<time>``)."""
    saved = saved_local(run_folder)
    return saved[-1] if saved else None


def earlier(fs: pyarrow.fs.FileSystem, path: str) -> list[str]:
    """The checkpoint folders beside ``path`` on ``fs`` that are older than it, oldest first
    (none when the folder cannot be listed)."""
    parent, _, name = path.rstrip("/").rpartition("/")
    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(parent))
    except (OSError, pyarrow.ArrowException):
        return []
    return sorted(info.path for info in infos if info.type == pyarrow.fs.FileType.Directory
                  and SAVED_NAME.match(info.base_name) and info.base_name < name)


def persist_local(source: Path, run_folder: Path, step: int, keep: int) -> Path:
    """What Ray Train's storage does for its workers, for a run trained in the driver's process:
    ``upload`` the checkpoint folder to ``run_folder/checkpoint_<time>`` (Ray's naming, so either
    way of running resumes from the other's checkpoints), then delete all but the newest ``keep``."""
    run_folder.mkdir(parents=True, exist_ok=True)
    dest = run_folder / f"checkpoint_{datetime.now():%Y-%m-%d_%H-%M-%S.%f}"
    upload(source, pyarrow.fs.LocalFileSystem(), str(dest), step)
    for old in saved_local(run_folder)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return dest


def load_state(folder: Path, shown_as: str = "") -> dict[str, Any]:
    """The state a checkpoint folder saved, read as data (see the module docstring), on the CPU.
    ``shown_as``: how errors name the folder (e.g. the URI it was downloaded from). Raises
    ``CheckpointRefused`` for a file that asks to run or build anything else, ``CheckpointError``
    for one missing, truncated or corrupt."""
    path = folder / STATE_FILE
    shown = f"{shown_as.rstrip('/')}/{STATE_FILE}" if shown_as else str(path)
    if not path.is_file():
        raise CheckpointError(f"{shown}: missing; a urm_ray checkpoint folder holds {STATE_FILE} and "
                              f"{CONFIG_FILE}")
    try:
        with torch.serialization.safe_globals(_OLDER_FORMAT):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        asked = re.findall(r"GLOBAL ([\w.]+)", str(err))
        if asked:
            raise CheckpointRefused(
                f"{shown}: refused: loading it would call or build {asked[0]}, which a urm_ray "
                "checkpoint never holds (it holds tensors and plain values); nothing of it was run"
            ) from None
        raise CheckpointError(f"{shown}: truncated or corrupt (it does not unpickle as a checkpoint "
                              "torch.save wrote)") from err
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        reason = str(err).split(". ")[0].strip() or type(err).__name__
        raise CheckpointError(f"{shown}: truncated or corrupt ({reason})") from err


def load_newest(folders: Sequence[Folder], read: Callable[[Folder], dict[str, Any]],
                ) -> tuple[Folder, dict[str, Any]] | None:
    """The newest of a run's checkpoint ``folders`` (oldest first) that ``read`` reads whole, and
    its state; None when there are none. One that does not read (a write cut short on a disk that
    lost what was not flushed, a copy that stopped midway) is passed over with a warning naming
    it. A refused one stops the resume, as does the oldest when none reads."""
    for tried, folder in enumerate(reversed(folders)):
        try:
            return folder, read(folder)
        except CheckpointRefused:
            raise
        except CheckpointError as err:
            if tried == len(folders) - 1:
                raise
            logger.warning("%s; resuming from the checkpoint before it instead", err)
    return None


def load_config_dict(folder: Path) -> dict[str, Any]:
    """The run config a checkpoint folder holds, its renamed keys under their new names (a
    checkpoint written before a rename still loads)."""
    from urm_ray.config import renamed

    path = folder / CONFIG_FILE
    if not path.is_file():
        raise DataError(f"{folder}: not a urm_ray checkpoint folder ({CONFIG_FILE} is missing); expected "
                        "a checkpoint_<time> folder under checkpoint.storage_path/<run_name>")
    import yaml

    data = yaml.safe_load(path.read_text())
    return renamed(data) if isinstance(data, dict) else data


def restore_weights(state: dict[str, Any], model: torch.nn.Module, ema: Any | None) -> None:
    """The saved weights into a freshly built model, and the saved averages into its EMA where
    both the run and the build keep one: what resuming and evaluating a checkpoint both load."""
    model.load_state_dict(state["model"])
    if ema is not None and state["ema"] is not None:
        ema.load_state_dict(state["ema"])


def restore(
    state: dict[str, Any], model: torch.nn.Module, ema: Any | None, optimizers: list[Any],
    rank: int = 0, seed: int = 0,
) -> tuple[Position, Any | None]:
    """Load a saved state into freshly built objects; returns the saved position and this rank's
    ACT carry (None: the rows start afresh). A rank the checkpoint has no state for (the run
    resumes on more workers) gets a fresh per-rank seed instead."""
    restore_weights(state, model, ema)
    for opt, opt_state in zip(optimizers, state["optimizers"], strict=True):
        opt.load_state_dict(opt_state)
    ranks = state.get("ranks") or [{"rng": state["rng"], "carry": None}]  # older checkpoints
    if rank >= len(ranks):
        torch.manual_seed(rank_seed(seed, rank))
        return Position(**state["position"]), None
    set_rng_state(ranks[rank]["rng"])
    carry = ranks[rank]["carry"]
    if isinstance(carry, ACTCarry):  # as older checkpoints hold it: its fields as pickled
        carry = dict(vars(carry))
    if isinstance(carry, dict):
        if "steps" in carry:  # the segment counter's name in older checkpoints
            carry["segments"] = carry.pop("steps")
        carry = ACTCarry(**carry)
    return Position(**state["position"]), carry
