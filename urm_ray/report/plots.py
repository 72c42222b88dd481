"""The report's plots, each a PNG inlined as a ``data:`` URI (the page needs no other file).

Figures are built with ``matplotlib.figure.Figure`` (no pyplot: nothing global, no window).
"""

from __future__ import annotations

import base64
import io
import statistics
from collections.abc import Callable

from matplotlib.figure import Figure

from urm_ray.report.data import SweepData, best_so_far

COLORS = {"completed": "tab:blue", "pruned": "tab:orange", "failed": "tab:red"}
SIZE = (6.4, 3.6)  # inches; at DPI this is a 704 x 396 pixel image
DPI = 110


def _png(draw: Callable[[Figure], None]) -> str:
    figure = Figure(figsize=SIZE, dpi=DPI)
    draw(figure)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def learning_curves(data: SweepData) -> str:
    """The primary objective at each evaluation, one line per trial, coloured by fate."""
    def draw(figure: Figure) -> None:
        ax = figure.subplots()
        for trial in data.trials:
            if trial.curve:
                steps, values = zip(*trial.curve)
                ax.plot(steps, values, marker=".", color=COLORS.get(trial.fate, "tab:gray"), alpha=0.8)
        for fate, color in COLORS.items():
            ax.plot([], [], color=color, label=fate)
        for rung in data.rungs:
            ax.axvline(rung, color="0.8", linestyle=":", zorder=0)
        ax.set(xlabel="training step", ylabel=data.metric, title="learning curves (dotted: ASHA rungs)")
        ax.legend(fontsize="small")
    return _png(draw)


def progress(data: SweepData) -> str:
    """Best value so far against trial number and against device-hours, side by side."""
    def draw(figure: Figure) -> None:
        for ax, by in zip(figure.subplots(1, 2, sharey=True), ("trial", "cost")):
            xs, ys, label = best_so_far(data, by)
            ax.step(xs, ys, where="post", marker="o", markersize=3)
            ax.set(xlabel=label, title=f"best {data.metric} so far")
        figure.axes[0].set_ylabel(data.metric)
    return _png(draw)


def importances(data: SweepData) -> str:
    def draw(figure: Figure) -> None:
        ax = figure.subplots()
        names = list(data.importances)[::-1]  # most important at the top
        ax.barh(names, [data.importances[n] for n in names], color="tab:blue")
        ax.set(xlabel=f"importance for {data.metric} (fANOVA, sums to 1)", title="parameter importances")
    return _png(draw)


def rungs(data: SweepData) -> str:
    """Each trial's value at the rungs it reached; a cross where ASHA stopped it."""
    def draw(figure: Figure) -> None:
        ax = figure.subplots()
        for trial in data.trials:
            points = [(r, next(v for s, v in trial.curve if s >= r)) for r in data.rungs
                      if any(s >= r for s, _ in trial.curve)]
            if not points:
                continue
            ax.plot(*zip(*points), color=COLORS.get(trial.fate, "tab:gray"), alpha=0.6, marker=".")
            stop = data.stopped_at(trial)
            if stop is not None:
                ax.plot([stop], [dict(points)[stop]], marker="x", markersize=9, color="tab:red")
        ax.set_xticks(data.rungs)
        ax.set(xlabel="rung (training step)", ylabel=data.metric, title="ASHA rungs (x: stopped there)")
    return _png(draw)


def front(data: SweepData) -> str:
    """The first two objectives of every completed trial; the front's members joined."""
    def draw(figure: Figure) -> None:
        ax = figure.subplots()
        done = [t for t in data.trials if t.values]
        ax.scatter([t.values[0] for t in done], [t.values[1] for t in done], color="0.6", label="completed")
        members = sorted((t for t in done if t.number in data.front), key=lambda t: t.values[0])
        ax.plot([t.values[0] for t in members], [t.values[1] for t in members], marker="o",
                color="tab:red", label="Pareto front")
        for t in members:
            ax.annotate(f"t{t.number:03d}", (t.values[0], t.values[1]), fontsize="small")
        ax.set(xlabel=f"{data.metrics[0]} ({data.modes[0]})", ylabel=f"{data.metrics[1]} ({data.modes[1]})",
               title="Pareto front")
        ax.legend(fontsize="small")
    return _png(draw)


def seed_bands(curves: dict[str, list[list[tuple[int, float]]]], metric: str) -> str:
    """Per row, the mean over its seeds at each step, shaded +- one sd (steps every seed logged)."""
    def draw(figure: Figure) -> None:
        ax = figure.subplots()
        for row, seeds in curves.items():
            by_seed = [dict(c) for c in seeds if c]
            steps = sorted(set.intersection(*(set(c) for c in by_seed))) if by_seed else []
            if not steps:
                continue
            values = [[c[s] for c in by_seed] for s in steps]
            mean = [statistics.fmean(v) for v in values]
            sd = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
            line, = ax.plot(steps, mean, label=f"{row} ({len(by_seed)} seeds)")
            ax.fill_between(steps, [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)],
                            color=line.get_color(), alpha=0.2)
        ax.set(xlabel="training step", ylabel=metric, title="final runs: mean +- sd over seeds")
        ax.legend(fontsize="small")
    return _png(draw)
