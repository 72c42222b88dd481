"""What one of several processes does in step with the others (a light module: spawned
processes import it, not the test module with its heavy imports)."""

from __future__ import annotations

from typing import Any

from urm_ray import tracking


def open_runs_on_one_dataset(uri: str, run_name: str, rounds: int, barrier: Any, failures: Any) -> None:
    """Each round, with the other processes: open ``run_name`` in the new experiment
    ``race-<k>`` and log dataset ``d<k>`` into it."""
    for k in range(rounds):
        barrier.wait(timeout=60)  # a peer that died ends this one too, instead of a hang
        try:
            run_id = tracking.open_run(uri, f"race-{k:03d}", run_name, {})
            tracking.Run(uri, run_id).log_dataset("sudoku4", "/data/sudoku4", f"d{k:03d}", {"task": "sudoku"})
        except Exception as err:  # noqa: BLE001 - the parent test reports it
            failures.put(repr(err)[:300])
