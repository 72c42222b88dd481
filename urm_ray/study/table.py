"""A study's results table: per row and metric, the mean +- sd over the final seeds, a 95 %
Student-t interval, the seeds counted, the device-hours spent and the published figure.

    table = StudyTable("sudoku4-families", ["eval/exact_accuracy"], [TableRow(...), ...])
    table.to_markdown(); table.to_csv(); table.row("urm").cells["eval/exact_accuracy"].mean

A typed object, so that other views (the HTML report, MLflow) render the same numbers.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from scipy import stats

from urm_ray.study.baselines import Baseline

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Cell:
    """One metric of one row over its seeds."""

    metric: str
    values: tuple[float, ...]  # one per final seed, in seed order

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def sd(self) -> float:
        """The sample standard deviation (n - 1 in the denominator)."""
        return statistics.stdev(self.values) if self.n > 1 else math.nan

    @property
    def ci(self) -> tuple[float, float]:
        """The 95 % confidence interval of the mean: mean +- t(0.975, n - 1) sd / sqrt(n)."""
        if self.n < 2:
            return (math.nan, math.nan)
        half = stats.t.ppf(0.5 + CONFIDENCE / 2, self.n - 1) * self.sd / math.sqrt(self.n)
        return (self.mean - half, self.mean + half)

    def text(self, interval: bool = True) -> str:
        """mean +- sd over the seeds, and its 95 % interval when ``interval``; "-": no seed yet."""
        if self.n == 0:
            return "-"
        if self.n == 1:
            return f"{self.mean:.4f}"
        low, high = self.ci
        return f"{self.mean:.4f} +- {self.sd:.4f}" + (f" [{low:.4f}, {high:.4f}]" if interval else "")


@dataclass(frozen=True)
class TableRow:
    name: str
    task: str
    family: str
    benchmark: str
    sweep: str
    cells: dict[str, Cell]  # metric -> its cell
    seeds: tuple[int, ...]  # the final runs' train.seed values counted
    device_hours: float
    cost_source: str  # "cost/device_seconds" (measured by the trials) or "wall time x workers"
    baselines: tuple[Baseline, ...] = ()

    @property
    def n(self) -> int:
        return len(self.seeds)


@dataclass(frozen=True)
class StudyTable:
    study: str
    metrics: list[str]
    rows: list[TableRow] = field(default_factory=list)

    def row(self, name: str) -> TableRow:
        return next(r for r in self.rows if r.name == name)

    def to_markdown(self) -> str:
        head = ["row", "task", "family", *self.metrics, "seeds", "device-hours", "published"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in self.rows:
            cells = [row.cells[m].text() for m in self.metrics]
            published = "; ".join(f"{b.measure} {b.value * 100:.1f} % ({b.source})" for b in row.baselines)
            lines.append("| " + " | ".join([row.name, row.task, row.family, *cells, str(row.n),
                                             f"{row.device_hours:.3f}", published or "-"]) + " |")
        sources = sorted({s for r in self.rows for s in r.cost_source.split(" and ") if s}) or ["no run yet"]
        lines += ["", "Each metric: mean +- sd over the final seeds [95 % Student-t interval]. "
                      f"Device-hours: every run of the row (trials, re-checks, finals), from {' and '.join(sources)}."]
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["row", "task", "family", "benchmark", "sweep", "metric", "n", "mean", "sd",
                         "ci_low", "ci_high", "values", "device_hours", "cost_source",
                         "published", "published_source"])
        for row in self.rows:
            figure = next((b for b in row.baselines), None)
            for metric in self.metrics:
                cell = row.cells[metric]
                matching = figure if figure is not None and figure.metric == metric else None
                writer.writerow([row.name, row.task, row.family, row.benchmark, row.sweep, metric, cell.n,
                                 _num(cell.mean), _num(cell.sd), _num(cell.ci[0]), _num(cell.ci[1]),
                                 " ".join(_num(v) for v in cell.values), _num(row.device_hours),
                                 row.cost_source, _num(matching.value) if matching else "",
                                 matching.source if matching else ""])
        return out.getvalue()

    def page_rows(self) -> list[dict[str, Any]]:
        """The results table as the study's report page shows it: mean +- sd over the seeds."""
        return [{"row": r.name, "task": r.task, "family": r.family, "seeds": r.n,
                 **{m: r.cells[m].text(interval=False) for m in self.metrics}, "device_hours": r.device_hours}
                for r in self.rows]

    def row_metrics(self, row: TableRow) -> dict[str, float]:
        """What the row's MLflow run logs: each metric's mean, sd, interval, and the cost."""
        out = {"seeds": float(row.n), "cost/device_hours": row.device_hours}
        for metric, cell in row.cells.items():
            out.update({f"{metric}/mean": cell.mean, f"{metric}/sd": cell.sd,
                        f"{metric}/ci_low": cell.ci[0], f"{metric}/ci_high": cell.ci[1]})
        for b in row.baselines[:1]:
            out[f"published/{b.metric}"] = b.value
        return {k: v for k, v in out.items() if not math.isnan(v)}


def _num(value: float) -> str:
    return "" if math.isnan(value) else repr(float(value))
