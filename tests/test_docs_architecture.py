"""The architecture page's module map names every module of the package, so it cannot fall behind
the code: a row names a module by its path under ``urm_ray/`` (``train/step.py``), by its bare
name after a path of the same folder in that row (``tune/space.py``, ``params.py``), by its bare
name under a heading that names the folder (``### Models (`models/`)``), or as a whole folder
(``data/tasks/arc/``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "urm_ray"
PAGE = ROOT / "docs" / "architecture.md"


def _named() -> set[str]:
    """Every module path (relative to urm_ray/) or folder (ending in /) the module map's rows name."""
    named: set[str] = set()
    heading_folder = ""
    for line in PAGE.read_text().split("## Module map", 1)[1].split("\n## ", 1)[0].splitlines():
        if line.startswith("### "):
            found = re.search(r"`([\w/]+/)`", line)
            heading_folder = found.group(1) if found else ""
        if not line.startswith("| `"):
            continue
        row_folder = ""
        for token in re.findall(r"`([\w/.]+)`", line.split("|")[1]):
            if "/" in token:
                row_folder = token if token.endswith("/") else token.rsplit("/", 1)[0] + "/"
                named.add(token)
            else:
                named.update({token, row_folder + token, heading_folder + token})
    return named


def _modules() -> list[str]:
    """The package's modules relative to urm_ray/: those git tracks in a checkout (a file not yet
    added is nobody's module yet), else every .py file."""
    try:
        listed = subprocess.run(["git", "ls-files", "*.py"], cwd=PACKAGE, capture_output=True, text=True,
                                check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        listed = []
    return sorted(listed) or sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def test_the_module_map_names_every_module():
    named = _named()
    missing = []
    for module in _modules():
        if module.endswith("__init__.py") and module != "__init__.py":
            continue
        folders = [module.rsplit("/", i)[0] + "/" for i in range(1, module.count("/") + 1)]
        if module not in named and not any(folder in named for folder in folders):
            missing.append(module)
    assert not missing, f"docs/architecture.md's module map lacks {missing}"
