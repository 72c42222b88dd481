"""Training checkpoints: everything needed to rebuild and resume a run from one folder.

A checkpoint folder holds ``state.pt`` (model, EMA, optimizers, step, data position, RNG states)
and ``config.yaml`` (the resolved run config), so ``urm-ray eval`` and resume need nothing else.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from urm_ray.errors import DataError

STATE_FILE = "state.pt"
CONFIG_FILE = "config.yaml"


@dataclass
class Position:
    """Where training stands: optimizer steps done and the data position (epoch, batch)."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # batches of ``epoch`` already consumed


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(
    folder: Path,
    model: torch.nn.Module,
    ema: Any | None,
    optimizers: list[Any],
    position: Position,
    config: dict[str, Any],
) -> None:
    """Write ``state.pt`` and ``config.yaml`` into ``folder`` (which must exist)."""
    state = {
        "model": model.state_dict(),
        "ema": ema.state_dict() if ema is not None else None,
        "optimizers": [opt.state_dict() for opt in optimizers],
        "position": vars(position),
        "rng": rng_state(),
    }
    torch.save(state, folder / STATE_FILE)
    (folder / CONFIG_FILE).write_text(yaml.safe_dump(config, sort_keys=False))


def load_state(folder: Path) -> dict[str, Any]:
    # weights_only=False: the RNG states are numpy/python objects written by this package.
    return torch.load(folder / STATE_FILE, map_location="cpu", weights_only=False)


def load_config_dict(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise DataError(f"{folder}: not a urm_ray checkpoint folder ({CONFIG_FILE} is missing); expected "
                        "a checkpoint_<time> folder under train.storage_path/<run_name>")
    return yaml.safe_load(path.read_text())


def restore(
    state: dict[str, Any], model: torch.nn.Module, ema: Any | None, optimizers: list[Any]
) -> Position:
    """Load a saved state into freshly built objects; returns the saved position."""
    model.load_state_dict(state["model"])
    if ema is not None and state["ema"] is not None:
        ema.load_state_dict(state["ema"])
    for opt, opt_state in zip(optimizers, state["optimizers"], strict=True):
        opt.load_state_dict(opt_state)
    set_rng_state(state["rng"])
    return Position(**state["position"])
