"""Plain-text tables for the terminal: each column padded to its widest cell.

    print(render([["t000", "completed", "0.812"]], ["trial", "state", "best"]))
"""

from __future__ import annotations

from typing import Any


def render(rows: list[list[Any]], header: list[str]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip()
             for row in [header, *rows]]
    return "\n".join(lines)


def short(value: Any) -> str:
    """Floats to 4 significant digits; anything else as ``str``."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
