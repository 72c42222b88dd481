"""Config of the data pipeline (kept free of heavy imports so configs load fast)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

from urm_ray.errors import ConfigError


@dataclass
class DataConfig:
    """Which dataset to stream and how to augment it."""

    path: str = ""  # dataset folder (Parquet + metadata.json); required
    augment: bool = True  # apply the dataset's augmentation on the fly in training
    num_augmentations: int = 8  # augmentation slots per puzzle per epoch (aug index 0 = original)
    shuffle_seed: int = 0  # seed of the augmentations and of the row order inside blocks
    eval_split: str = "test"  # the held-out split that training's evaluations score
    shuffle_buffer: int = 4096  # local shuffle buffer rows per worker
    # ARC: shift each training pair on the 30x30 canvas (with augment). auto = on ARC data; true =
    # the same, but says it asked for it, so other data or augment=false warns; false = off
    translate: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        if self.num_augmentations < 1:
            raise ConfigError(f"data.num_augmentations={self.num_augmentations} must be >= 1")
        if self.shuffle_buffer < 0:
            raise ConfigError(f"data.shuffle_buffer={self.shuffle_buffer} must be >= 0")
        if self.shuffle_seed < 0:
            raise ConfigError(f"data.shuffle_seed={self.shuffle_seed} must be >= 0")
        if not self.eval_split:
            raise ConfigError("data.eval_split must name a split, got ''")
        if not self.augment and self.num_augmentations != 1:
            warnings.warn(
                f"data.num_augmentations={self.num_augmentations} has no effect with"
                " data.augment=false (each puzzle appears once per epoch)",
                stacklevel=2,
            )
        if not self.augment and self.translate is True:
            warnings.warn("data.translate=true has no effect with data.augment=false (translation is "
                          "part of the training augmentation)", stacklevel=2)

    def augmentation_slots(self) -> int:
        """Augmentation indices per puzzle in training: num_augmentations, 1 without augment."""
        return self.num_augmentations if self.augment else 1
