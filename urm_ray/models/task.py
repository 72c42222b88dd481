"""The dataset facts a model is sized by: a leaf module, so model files can name it without
importing the registry (which imports every family)."""

from __future__ import annotations

from dataclasses import dataclass

from urm_ray.errors import ConfigError


@dataclass(frozen=True)
class TaskSpec:
    """The dataset facts a model is sized by (from the dataset's metadata)."""

    vocab_size: int  # token ids are 0..vocab_size-1
    seq_len: int  # tokens per row, without the puzzle prefix
    num_puzzle_identifiers: int  # rows of the puzzle-embedding table

    def __post_init__(self) -> None:
        for key in ("vocab_size", "seq_len", "num_puzzle_identifiers"):
            if getattr(self, key) < 1:
                raise ConfigError(f"task.{key}={getattr(self, key)} must be >= 1")
