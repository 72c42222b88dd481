"""Small datasets shipped as recipes: ``data.path: builtin:<name>`` builds them on first use.

They live in ``$XDG_CACHE_HOME/urm_ray/<name>`` (default ``~/.cache/urm_ray``), are built once
with a fixed seed, and are what the presets and the README's one-command job train on. Each
folder holds its recipe (``recipe.json``): a folder built by another recipe of the same name (an
older version of urm_ray) is built again, not trained on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from urm_ray.data.tasks import coloring, nqueens, sudoku
from urm_ray.errors import ConfigError

PREFIX = "builtin:"
RECIPE_FILE = "recipe.json"


@dataclass(frozen=True)
class Recipe:
    """A builder (``build(out_dir, **args, overwrite=...)``) and its arguments."""

    build: Callable[..., object]
    args: dict[str, Any] = field(default_factory=dict)

    def fingerprint(self) -> str:
        return json.dumps({"builder": f"{self.build.__module__}.{self.build.__qualname__}", **self.args},
                          sort_keys=True)


RECIPES: dict[str, Recipe] = {
    # 4x4 Sudoku, 10 of 16 cells blank, unique solutions; test puzzles differ from every train
    # puzzle even after relabelling digits.
    "sudoku4": Recipe(sudoku.build_generated, dict(size=4, num_train=3000, num_test=500, blanks=10, seed=0)),
    # every valid 4x4 board (288) as a label of the blank board, 16 copies each in train
    "sudoku4-blank": Recipe(sudoku.build_blank, dict(size=4, repeats=16)),
    # 6x6 Sudoku, 20 of 36 cells blank.
    "sudoku6": Recipe(sudoku.build_generated, dict(size=6, num_train=10000, num_test=1000, blanks=20, seed=0)),
    # 9x9 Sudoku, 12 of 81 cells blank: learnable on a CPU in half an hour (sudoku9-urm)
    "sudoku9": Recipe(sudoku.build_generated, dict(size=9, num_train=20000, num_test=500, blanks=12, seed=0)),
    # every 6-queens solution (4) as a label of the empty board, 512 copies each in train
    "nqueens6": Recipe(nqueens.build_unconditional, dict(n=6, repeats=512)),
    # every 8-queens solution (92) as a label of the empty board, 64 copies each in train
    "nqueens8": Recipe(nqueens.build_unconditional, dict(n=8, repeats=64)),
    # 3-colourable graphs of 8 nodes (planted colouring, edge probability 0.5)
    "coloring8": Recipe(coloring.build_generated,
                        dict(n=8, colors=3, num_train=5000, num_test=500, edge_prob=0.5, seed=0)),
}


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "urm_ray"


def resolve_path(path: str) -> str:
    """Map ``builtin:<name>`` to its cache folder, building it if it is missing or was built by
    another recipe; other paths unchanged."""
    if not path.startswith(PREFIX):
        return path
    name = path[len(PREFIX):]
    if name not in RECIPES:
        raise ConfigError(f"data.path={path!r}: unknown built-in dataset; expected one of "
                          f"{', '.join(PREFIX + n for n in RECIPES)}")
    recipe, folder = RECIPES[name], cache_dir() / name
    stamp = folder / RECIPE_FILE
    if not (folder / "metadata.json").is_file():
        print(f"building built-in dataset {name} in {folder}")
    elif not stamp.is_file() or stamp.read_text() != recipe.fingerprint():
        print(f"building built-in dataset {name} in {folder} again: it was built by another recipe")
    else:
        return str(folder)
    recipe.build(folder, **recipe.args, overwrite=True)  # written aside, then renamed into place
    stamp.write_text(recipe.fingerprint())
    return str(folder)
