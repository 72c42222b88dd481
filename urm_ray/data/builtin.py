"""Small datasets shipped as recipes: ``data.path: builtin:<name>`` builds them on first use.

They live in ``$XDG_CACHE_HOME/urm_ray/<name>`` (default ``~/.cache/urm_ray``), are built once
with a fixed seed, and are what the presets and the README's one-command job train on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from urm_ray.data.tasks import coloring, nqueens, sudoku
from urm_ray.errors import ConfigError

PREFIX = "builtin:"

RECIPES: dict[str, Callable[[Path], object]] = {
    # 4x4 Sudoku, 10 of 16 cells blank, unique solutions; test puzzles differ from every train
    # puzzle even after relabelling digits.
    "sudoku4": lambda out: sudoku.build_generated(
        out, size=4, num_train=3000, num_test=500, blanks=10, seed=0
    ),
    # every valid 4x4 board (288) as a label of the blank board, 16 copies each in train
    "sudoku4-blank": lambda out: sudoku.build_blank(out, size=4, repeats=16),
    # 6x6 Sudoku, 20 of 36 cells blank.
    "sudoku6": lambda out: sudoku.build_generated(
        out, size=6, num_train=10000, num_test=1000, blanks=20, seed=0
    ),
    # every 6-queens solution (4) as a label of the empty board, 512 copies each in train
    "nqueens6": lambda out: nqueens.build_unconditional(out, n=6, repeats=512),
    # every 8-queens solution (92) as a label of the empty board, 64 copies each in train
    "nqueens8": lambda out: nqueens.build_unconditional(out, n=8, repeats=64),
    # 3-colourable graphs of 8 nodes (planted colouring, edge probability 0.5)
    "coloring8": lambda out: coloring.build_generated(
        out, n=8, colors=3, num_train=5000, num_test=500, edge_prob=0.5, seed=0
    ),
}


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "urm_ray"


def resolve_path(path: str) -> str:
    """Map ``builtin:<name>`` to its cache folder, building it if needed; other paths unchanged."""
    if not path.startswith(PREFIX):
        return path
    name = path[len(PREFIX):]
    if name not in RECIPES:
        raise ConfigError(f"data.path={path!r}: unknown built-in dataset; expected one of "
                          f"{', '.join(PREFIX + n for n in RECIPES)}")
    folder = cache_dir() / name
    if not (folder / "metadata.json").is_file():
        print(f"building built-in dataset {name} in {folder}")
        RECIPES[name](folder)
    return str(folder)
