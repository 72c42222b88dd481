"""Training checkpoints: everything needed to rebuild and resume a run from one folder.

A checkpoint folder holds ``state.pt`` (model, EMA, optimizers, step, data position, and per
rank the RNG states and the ACT carry) and ``config.yaml`` (the resolved run config), so
``urm-ray eval`` and resume need nothing else. With the per-rank state a resumed run continues
exactly as the uninterrupted run would have (bit for bit on CPU): the rows in flight keep their
recurrent state and the random draws (ACT exploration, GRAM's noise) repeat.

A checkpoint reaches ``train.storage_path`` whole or not at all (``upload``): on a local disk it
is written under a hidden temporary name and renamed at the end; on object storage, where each
object appears only once complete, ``state.pt`` goes last. A failed write (a full disk, lost
credentials) removes what it wrote and names the step and the destination.
"""

from __future__ import annotations

import random
import shutil
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow
import pyarrow.fs
import torch

from urm_ray import redact
from urm_ray.errors import CheckpointWriteError, DataError

STATE_FILE = "state.pt"
CONFIG_FILE = "config.yaml"


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
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def rank_state(carry: Any | None) -> dict[str, Any]:
    """What one rank contributes to a checkpoint: its RNG states and its ACT carry (on the CPU)."""
    return {"rng": rng_state(), "carry": None if carry is None else carry.to("cpu")}


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
    renamed = fs.type_name == "local"  # a rename is atomic there; on object storage it is a copy
    target = f"{parent}/.partial-{name}" if renamed else dest
    files = sorted(source.iterdir(), key=lambda path: (path.name == STATE_FILE, path.name))
    try:
        fs.create_dir(target)
        for path in files:
            with path.open("rb") as src, fs.open_output_stream(f"{target}/{path.name}") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        if renamed:
            fs.move(target, dest)
    except (OSError, pyarrow.ArrowException) as err:
        with suppress(OSError, pyarrow.ArrowException):
            fs.delete_dir(target)
        raise CheckpointWriteError(f"the checkpoint of step {step} could not be written to {dest} "
                                   f"({err}); nothing of it was kept there") from err


def saved_local(run_folder: Path) -> list[Path]:
    """A run's complete checkpoint folders on local storage (``checkpoint_<time>``), oldest first."""
    return sorted(p for p in run_folder.glob("checkpoint_2*") if (p / STATE_FILE).is_file())


def latest_local(run_folder: Path) -> Path | None:
    """The newest complete checkpoint folder of a run on local storage (``checkpoint_<time>``)."""
    saved = saved_local(run_folder)
    return saved[-1] if saved else None


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


def load_state(folder: Path) -> dict[str, Any]:
    # weights_only=False: the RNG states are numpy/python objects written by this package.
    return torch.load(folder / STATE_FILE, map_location="cpu", weights_only=False)


def load_config_dict(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise DataError(f"{folder}: not a urm_ray checkpoint folder ({CONFIG_FILE} is missing); expected "
                        "a checkpoint_<time> folder under train.storage_path/<run_name>")
    import yaml

    return yaml.safe_load(path.read_text())


def restore(
    state: dict[str, Any], model: torch.nn.Module, ema: Any | None, optimizers: list[Any],
    rank: int = 0, seed: int = 0,
) -> tuple[Position, Any | None]:
    """Load a saved state into freshly built objects; returns the saved position and this rank's
    ACT carry (None: the rows start afresh). A rank the checkpoint has no state for (the run
    resumes on more workers) gets a fresh per-rank seed instead."""
    model.load_state_dict(state["model"])
    if ema is not None and state["ema"] is not None:
        ema.load_state_dict(state["ema"])
    for opt, opt_state in zip(optimizers, state["optimizers"], strict=True):
        opt.load_state_dict(opt_state)
    ranks = state.get("ranks") or [{"rng": state["rng"], "carry": None}]  # older checkpoints
    if rank >= len(ranks):
        torch.manual_seed(rank_seed(seed, rank))
        return Position(**state["position"]), None
    set_rng_state(ranks[rank]["rng"])
    return Position(**state["position"]), ranks[rank]["carry"]
