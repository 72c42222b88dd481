"""The Pareto front of a multi-objective sweep: which completed trials no other trial beats.

    front = pareto_front(study.trials, space.spec.objectives)   # completed, non-dominated
    dominates(a, b, signs)                                       # on signed values: higher is better

Trial ``a`` dominates ``b`` when it is at least as good on every objective and better on one.
Only COMPLETED trials make the front: a trial stopped early (PRUNED) has no final values, so an
early, cheap-looking point never sits on it. A finished sweep writes the front to
``pareto.csv`` (one row per member, its objectives and sampled values), uploads it to the
parent MLflow run, and tags every trial's run ``urm_ray.pareto`` = ``true`` or ``false``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from urm_ray.errors import ConfigError

PARETO_FILE = "pareto.csv"
PARETO_TAG = "urm_ray.pareto"


def signs(objectives: Sequence[Any]) -> list[float]:
    """+1 for an objective maximised, -1 for one minimised: signed values are higher-is-better."""
    return [1.0 if o.mode == "max" else -1.0 for o in objectives]


def signed(values: Sequence[float], sign: Sequence[float]) -> tuple[float, ...]:
    """Higher-is-better values; NaN (a metric that could not be computed) ranks below all."""
    return tuple(-math.inf if math.isnan(v) else s * v for v, s in zip(values, sign))


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Signed values ``a`` at least as good as ``b`` everywhere and better somewhere."""
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


def pareto_front(trials: Sequence[FrozenTrial], objectives: Sequence[Any]) -> list[FrozenTrial]:
    """Completed trials that no completed trial dominates, best first by the first objective
    (ties by trial number). Trials with equal values are all kept."""
    sign = signs(objectives)
    done = [(t, signed(t.values, sign)) for t in trials if t.state == TrialState.COMPLETE and t.values]
    front = [t for t, v in done if not any(dominates(w, v) for _, w in done)]
    return sorted(front, key=lambda t: (-signed(t.values, sign)[0], t.number))


def pick(trials: Sequence[FrozenTrial], objectives: Sequence[Any], number: int) -> FrozenTrial:
    """Trial ``number`` if it is on the front, else a ConfigError naming the front's trials."""
    front = pareto_front(trials, objectives)
    for trial in front:
        if trial.number == number:
            return trial
    members = ", ".join(str(t.number) for t in front) or "none yet"
    raise ConfigError(f"--pick {number}: trial {number} is not on the Pareto front "
                      f"(front trials: {members})")


def rows(front: Sequence[FrozenTrial], objectives: Sequence[Any], keys: Sequence[str]) -> list[dict[str, Any]]:
    """One row per front member: trial, objective values, sampled values."""
    out = []
    for trial in front:
        row: dict[str, Any] = {"trial": trial.number}
        row.update({o.metric: v for o, v in zip(objectives, trial.values)})
        row.update({k: trial.params.get(k, "") for k in keys})
        out.append(row)
    return out


def write_csv(front_rows: list[dict[str, Any]], header: Sequence[str], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(header))
        writer.writeheader()
        writer.writerows(front_rows)


def describe(front: Sequence[FrozenTrial], objectives: Sequence[Any], keys: Sequence[str]) -> str:
    """The front as a text table, for ``urm-ray best``."""
    from urm_ray.table import render, short

    header = ["trial", *(o.metric for o in objectives), *(k.split(".")[-1] for k in keys)]
    body = [[f"t{r['trial']:03d}", *(short(r[h]) for h in [*(o.metric for o in objectives), *keys])]
            for r in rows(front, objectives, keys)]
    return render(body, header)
