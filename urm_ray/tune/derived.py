"""A trial's derived metrics (e.g. compute per row) and the report callback that adds them.

Light on purpose: the callback is pickled into Ray Train's controller for a trial on several
workers, and every module it names is imported there, on the trial's critical path. This module
imports Ray Tune's callback and the expression evaluator only (no torch, MLflow or config).

A derived metric that cannot be computed for a report (a division by a metric that is 0, a
non-finite input) is NaN there, with one warning per metric and trial: the trial goes on, and the
sweep ranks NaN below every value (``rungs.StudyASHA`` stops it at a rung; Optuna records the
trial as failed, which its sampler leaves out).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ray.tune.integration.ray_train import TuneReportCallback

from urm_ray.errors import ConfigError
from urm_ray.tune.expr import Expr

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from urm_ray.tune.params import Value
    from urm_ray.tune.space import SearchSpace


@dataclass(frozen=True)
class Derived:
    """One trial's derived metrics: the space's expressions over its config values (``env``) and
    its metrics, and the objectives (``required``) a report needs before Tune may see it."""

    env: dict[str, float]
    exprs: dict[str, Expr]
    required: tuple[str, ...]
    warned: set[str] = field(default_factory=set, compare=False)  # metrics already warned about

    @classmethod
    def of(cls, space: SearchSpace, values: dict[str, Value]) -> Derived:
        return cls(space.env(values), dict(space.derived), tuple(o.metric for o in space.spec.objectives))

    def add(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """``metrics`` with every derived metric whose inputs are there."""
        env = {**self.env, **metrics}
        extra = {name: self._value(name, expr, env) for name, expr in self.exprs.items()
                 if expr.names <= set(env)}
        return {**metrics, **extra}

    def _value(self, name: str, expr: Expr, env: dict[str, Any]) -> float:
        try:
            return expr.evaluate(env)
        except ConfigError as err:
            if name not in self.warned:
                self.warned.add(name)
                logger.warning("derived metric %s is NaN: %s", name, err)
            return math.nan

    def complete(self, metrics: dict[str, Any]) -> bool:
        return all(metric in metrics for metric in self.required)

    def for_tune(self, metrics: dict[str, Any], checkpoint: bool) -> dict[str, Any] | None:
        """A one-worker trial's report as Tune gets it (``tune.trial_host.TrialHost``): with the derived
        metrics; None (kept out of Tune) before the first evaluation, unless it carries a
        checkpoint, which Tune must persist (the sweep lets such results through)."""
        metrics = self.add(metrics)
        return metrics if self.complete(metrics) or checkpoint else None


class DerivedReport(TuneReportCallback):
    """Tune's report callback for a trial on Ray Train's workers, plus the derived metrics.

    Reports without every objective (those before the first evaluation) stay out of Tune: its
    scheduler and searcher decide on the objectives alone, and Tune rejects a result that lacks
    them. MLflow still gets every report from rank 0.
    """

    def __init__(self, derived: Derived) -> None:
        super().__init__()
        self.derived = derived

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        metrics = [self.derived.add(metrics[0]), *metrics[1:]]
        if self.derived.complete(metrics[0]):
            super().after_report(run_context, metrics, checkpoint)
