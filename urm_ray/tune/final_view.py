"""What ``urm-ray final`` shows while it re-checks the top configs over seeds: one counter of the
seed runs, naming the ones running and the last result (a bar on a terminal, else a line each
time a run starts or ends):

    final re-check: 3/6 runs (0.02/s, 2:31, eta 2:31)  running 2/3 t005 seed 2  last 2/3 t005 seed 1 = 0.9120

Config ``2/3`` is the second best of the three re-checked; ``t005`` its trial in the sweep. The
winner's training then shows the bar of ``urm-ray train`` (``best.final``).
"""

from __future__ import annotations

import time
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial

from urm_ray.progress import Progress

REFRESH_S = 1.0  # the bar's clock is redrawn this often between events


def run_label(rank: int, candidates: int, trial_number: int, seed: int) -> str:
    """``2/3 t005 seed 1``: the second of three configs (sweep trial 5), its first seed."""
    return f"{rank}/{candidates} t{trial_number:03d} seed {seed}"


class RecheckProgress(Callback):
    """Tune callback of the re-check grid; ``labels``: its ``run`` values -> ``run_label``."""

    def __init__(self, labels: dict[str, str], metric: str, live: bool = False) -> None:
        self.labels, self.metric = labels, metric
        self.progress = Progress("final re-check", len(labels), unit="runs", live=live)
        self.running: list[str] = []
        self.finished = 0
        self._last_refresh = 0.0

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.running.append(self._label(trial))
        self._show({})

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial,
                          **info: Any) -> None:
        value = (trial.last_result or {}).get(self.metric)
        result = f"{value:.4f}" if isinstance(value, (int, float)) else "-"
        self._end(trial, f"{self._label(trial)} = {result}")

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._end(trial, f"{self._label(trial)} failed")

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if time.monotonic() - self._last_refresh >= REFRESH_S:
            self._last_refresh = time.monotonic()
            self.progress.refresh()

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.progress.close()

    def _label(self, trial: Trial) -> str:
        return self.labels[trial.config["run"]]

    def _end(self, trial: Trial, last: str) -> None:
        label = self._label(trial)
        if label in self.running:
            self.running.remove(label)
        self.finished += 1
        self._show({"last": last})

    def _show(self, fields: dict[str, str]) -> None:
        self.progress.update(self.finished, {"running": ", ".join(self.running) or "-", **fields})
