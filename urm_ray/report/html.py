"""The report as one self-contained HTML page: inline PNGs and tables, no script, no network.

    write_sweep(data, path)             # a sweep: curves, progress, importances, rungs, front, leaderboard
    write_study(study, metric, rows, curves, path)  # a study: seed bands and its results table
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from urm_ray.report import plots
from urm_ray.report.data import MIN_FOR_IMPORTANCE, SweepData

STYLE = """body{font-family:sans-serif;margin:1.5em auto;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em}img{max-width:100%;display:block}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#f3f3f3}.note{color:#666;font-size:.9em}"""


def write_sweep(data: SweepData, path: Path) -> Path:
    """The sweep's report at ``path``; written whole or not at all."""
    sections = [_figure("Learning curves", plots.learning_curves(data), "learning-curves")
                if any(t.curve for t in data.trials) else _note("Learning curves", "no evaluation yet"),
                _figure("Search progress", plots.progress(data), "progress")
                if any(t.values for t in data.trials) else _note("Search progress", "no completed trial yet")]
    if data.importances:
        sections.append(_figure("Parameter importances", plots.importances(data), "importances"))
    else:
        sections.append(_note("Parameter importances",
                              f"needs {MIN_FOR_IMPORTANCE} completed trials with different sampled values"))
    if data.rungs:
        stopped = [f"t{t.number:03d} at step {data.stopped_at(t)}" for t in data.trials
                   if data.stopped_at(t) is not None]
        sections.append(_figure("ASHA rungs", plots.rungs(data), "rungs",
                                "stopped: " + (", ".join(stopped) or "none")))
    if len(data.metrics) > 1 and data.front:
        sections.append(_figure("Pareto front", plots.front(data), "pareto",
                                "front: " + ", ".join(f"t{n:03d}" for n in data.front)))
    sections.append(f"<h2>Leaderboard</h2>\n{_table(data.leaderboard)}")
    fates: dict[str, int] = {}
    for trial in data.trials:
        fates[trial.fate] = fates.get(trial.fate, 0) + 1
    summary = ", ".join(f"{n} {fate}" for fate, n in sorted(fates.items()))
    objectives = ", ".join(f"{m} ({mode})" for m, mode in zip(data.metrics, data.modes))
    return _write(path, f"Sweep {data.name}", f"{len(data.trials)} trials ({summary}); objectives: {objectives}",
                  sections)


def write_study(study: str, metric: str, rows: list[dict[str, Any]],
                curves: dict[str, list[list[tuple[int, float]]]], path: Path) -> Path:
    """A study's report: its results table (``rows``, a dict per row, as ``StudyTable.page_rows``
    gives them); ``curves``: row -> one curve of ``metric`` per final seed (empty lists draw no
    band)."""
    sections = []
    if any(c for seeds in curves.values() for c in seeds):
        sections.append(_figure("Learning curves over seeds", plots.seed_bands(curves, metric), "seed-bands"))
    sections.append(f"<h2>Results</h2>\n{_table(rows)}<p class=note>mean +- sd over the final seeds</p>")
    return _write(path, f"Study {study}", f"{len(rows)} rows", sections)


def _figure(title: str, uri: str, anchor: str, caption: str = "") -> str:
    note = f"<p class=note>{html.escape(caption)}</p>" if caption else ""
    return f'<h2 id="{anchor}">{html.escape(title)}</h2>\n<img class=plot alt="{html.escape(title)}" src="{uri}">{note}'


def _note(title: str, text: str) -> str:
    return f"<h2>{html.escape(title)}</h2>\n<p class=note>{html.escape(text)}</p>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return html.escape(str(value))


def _table(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "<p class=note>no trials</p>"
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "\n".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row.values()) + "</tr>" for row in rows)
    return f"<div style=\"overflow-x:auto\"><table>\n<tr>{head}</tr>\n{body}\n</table></div>"


def _write(path: Path, title: str, summary: str, sections: list[str]) -> Path:
    page = (f"<!doctype html>\n<html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head>\n<body>\n<h1>{html.escape(title)}</h1>\n"
            f"<p>{html.escape(summary)}</p>\n" + "\n".join(sections) + "\n</body></html>\n")
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(page)
    partial.replace(path)  # a reader never sees half a page
    return path
