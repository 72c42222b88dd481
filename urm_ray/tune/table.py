"""The live table of trials printed while a sweep runs, under a line with the sweep's progress.

    sweep: 2/8 trials finished (1 completed, 1 pruned), 1 running; best eval/exact_accuracy 0.812 (t000)
    trial  state      step  eval/exact_accuracy  best   loops  truncation  lr
    t000   completed  400   0.812                0.812  4      1           0.00131
    t003   pruned     100   0.203                0.203  2      0           0.00042
    t004   running    150   0.331                0.331  6      2           0.0021

With several objectives a ``front`` column marks the completed trials on the Pareto front so far.
The table holds the ``TOP`` trials by their best value and the running ones, whatever the
sweep's size; a line under it counts the others (``urm-ray runs`` and the MLflow UI list every
trial). On a terminal it is redrawn in place every few seconds; otherwise (a log file, CI) each
finished trial prints the progress line and its own row, and the table is printed at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ray.tune import Callback
from ray.tune.experiment import Trial

from urm_ray.table import render, short
from urm_ray.tune.fate import trial_fate
from urm_ray.tune.pareto import dominates, signed, signs
from urm_ray.tune.trial import split_config

if TYPE_CHECKING:
    from urm_ray.tune.space import Objective

REFRESH_S = 5.0
TOP = 10  # finished trials shown, best first
STATES = {Trial.PENDING: "pending", Trial.RUNNING: "running", Trial.PAUSED: "paused",
          Trial.ERROR: "failed"}


class TrialTable(Callback):
    """Tune callback that draws the table; ``metric`` is the sweep's primary objective."""

    def __init__(self, metric: str, mode: str, full_steps: int, requested: int,
                 out: TextIO | None = None, objectives: Sequence[Objective] = ()) -> None:
        self.metric, self.mode, self.full_steps, self.requested = metric, mode, full_steps, requested
        # several objectives: a "front" column marks the completed trials no other one dominates
        self.objectives = list(objectives) if len(objectives) > 1 else []
        self.finals: dict[str, tuple[float, ...]] = {}  # completed trial id -> signed objective values
        self._out = out  # None = sys.stdout, looked up when drawing
        self.best: dict[str, float] = {}
        self.fates: dict[str, str] = {}  # trial id -> fate, once Tune has finished the trial
        self._drawn_lines = 0
        self._last_draw = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_out": None}  # Tune pickles its callbacks; streams do not pickle

    def get_state(self) -> dict[str, Any]:  # saved with Tune's experiment state, for resume
        return {"best": dict(self.best), "fates": dict(self.fates), "finals": dict(self.finals)}

    def set_state(self, state: dict[str, Any]) -> None:
        self.best, self.fates = state["best"], state["fates"]
        self.finals = state.get("finals", {})

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict,
                        **info: Any) -> None:
        value = result.get(self.metric)
        if isinstance(value, (int, float)):
            old = self.best.get(trial.trial_id)
            better = old is None or (value > old if self.mode == "max" else value < old)
            self.best[trial.trial_id] = value if better else old

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self._live() and time.monotonic() - self._last_draw >= REFRESH_S:
            self.draw(trials)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.fates[trial.trial_id] = trial_fate(trial, self.full_steps)
        last = trial.last_result or {}
        if self.objectives and self.fates[trial.trial_id] == "completed" and all(
                isinstance(last.get(o.metric), (int, float)) for o in self.objectives):
            self.finals[trial.trial_id] = signed([float(last[o.metric]) for o in self.objectives],
                                                 signs(self.objectives))
        self._finished(trials, trial)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.fates[trial.trial_id] = "failed"
        self._finished(trials, trial)

    def _finished(self, trials: list[Trial], trial: Trial) -> None:
        """A terminal redraws the table; a log gets the progress line and the trial's row (a
        sweep of N trials writes O(N) lines, not N tables)."""
        if self._live():
            self.draw(trials)
            return
        keys = self._keys(trials)
        self.out.write(f"{self.summary(trials)}\n{render([self._row(trial, keys)], self._header(keys))}\n")
        self.out.flush()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.draw(trials)

    def draw(self, trials: list[Trial]) -> None:
        text = f"{self.summary(trials)}\n{self.table(trials)}"
        if self._live() and self._drawn_lines:
            self.out.write(f"\x1b[{self._drawn_lines}F\x1b[J")  # back to the old table, clear it
        self.out.write(text + "\n")
        self.out.flush()
        self._drawn_lines = text.count("\n") + 1
        self._last_draw = time.monotonic()

    def summary(self, trials: list[Trial]) -> str:
        """Trials finished out of those requested (by fate), how many run, and the best value."""
        running = sum(t.status == Trial.RUNNING and t.trial_id not in self.fates for t in trials)
        by_fate: dict[str, int] = {}
        for fate in self.fates.values():
            by_fate[fate] = by_fate.get(fate, 0) + 1
        fates = f" ({', '.join(f'{n} {fate}' for fate, n in sorted(by_fate.items()))})" if by_fate else ""
        line = f"sweep: {len(self.fates)}/{self.requested} trials finished{fates}, {running} running"
        if not self.best:
            return line
        best_id = self._ranked(list(self.best))[0]
        names = {t.trial_id: f"t{split_config(t.config)[0]:03d}" for t in trials}
        return f"{line}; best {self.metric} {short(self.best[best_id])} ({names.get(best_id, '?')})"

    def table(self, trials: list[Trial]) -> str:
        """The ``TOP`` trials by best value and every running one, by trial number; then a line
        counting the trials left out."""
        keys = self._keys(trials)
        by_id = {t.trial_id: t for t in trials}
        top = set(self._ranked([i for i in self.best if i in by_id])[:TOP])
        running = {t.trial_id for t in trials if t.status == Trial.RUNNING and t.trial_id not in self.fates}
        shown = sorted((by_id[i] for i in top | running), key=lambda t: split_config(t.config)[0])
        text = render([self._row(t, keys) for t in shown], self._header(keys))
        hidden = len(trials) - len(shown)
        return f"{text}\n... {hidden} more (urm-ray runs lists every trial)" if hidden > 0 else text

    def _ranked(self, ids: list[str]) -> list[str]:
        """Trial ids by their best value, best first."""
        return sorted(ids, key=self.best.__getitem__, reverse=self.mode == "max")

    def _keys(self, trials: list[Trial]) -> list[str]:
        return sorted({k for t in trials for k in split_config(t.config)[1]})

    def _header(self, keys: list[str]) -> list[str]:
        front = ["front"] if self.objectives else []
        return ["trial", "state", "step", self.metric, "best", *front, *(k.split(".")[-1] for k in keys)]

    def _on_front(self, trial_id: str) -> bool:
        mine = self.finals.get(trial_id)
        return mine is not None and not any(dominates(v, mine) for v in self.finals.values())

    def _row(self, trial: Trial, keys: list[str]) -> list[str]:
        number, values = split_config(trial.config)
        last = trial.last_result or {}
        return [f"t{number:03d}", self._state(trial), short(last.get("step", "")),
                short(last.get(self.metric, "")), short(self.best.get(trial.trial_id, "")),
                *(["yes" if self._on_front(trial.trial_id) else ""] if self.objectives else []),
                *(short(values.get(k, "")) for k in keys)]

    def _state(self, trial: Trial) -> str:
        if trial.trial_id in self.fates:
            return self.fates[trial.trial_id]
        if trial.status == Trial.TERMINATED:  # stopped by an interruption; resumes later
            return "interrupted"
        return STATES.get(trial.status, trial.status.lower())

    def _live(self) -> bool:
        return self.out.isatty()
