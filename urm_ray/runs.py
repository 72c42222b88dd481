"""``urm-ray runs``: the runs and sweeps of an MLflow store, as the MLflow UI lists them.

    experiment  run                  kind   state     step     best eval/exact_accuracy  checkpoint
    sudoku4     urm-20261201-094713  train  FINISHED  100/100  0.4120                    runs/urm-.../checkpoint_...
    sweep-qs    qs                   sweep  RUNNING   3/8      0.8120 (t002)
    sweep-qs    qs-t002              trial  FINISHED  400/400  0.8120                    sweeps/qs/trials/...

Below the table (on stderr): each listed experiment's page in MLflow's UI, in its model-training
view, and how to start the UI on a local store.

Step: the last logged training step out of ``train.steps`` (a sweep: trials finished out of
requested). Best: the highest held-out exact accuracy the run logged (a sweep: its objective).
Checkpoint: the final one of a finished run, else the latest one on local storage. State:
MLflow's, except that a RUNNING run whose driver stopped beating (``urm_ray.heartbeat``) shows
as ``FAILED (driver lost)``.
"""

from __future__ import annotations

from pathlib import Path

from urm_ray import heartbeat, tracking
from urm_ray.config import RENAMED
from urm_ray.errors import ConfigError
from urm_ray.table import render
from urm_ray.tracking import CHECKPOINT_TAG, FATE_TAG, KIND_TAG, RESUMED_TAG_PREFIX, TRIAL_TAG, RunSummary

METRIC = "eval/exact_accuracy"
STEP_KEY = "train/lr"  # logged at every report
HEADER = ["experiment", "run", "kind", "state", "step", f"best {METRIC}", "checkpoint"]


def _value(metric: float) -> str:
    return f"{metric:.4f}"


def kind(run: RunSummary) -> str:
    if KIND_TAG in run.tags:
        return run.tags[KIND_TAG]
    return "eval" if "/eval-" in run.run_name else "train"


def state(run: RunSummary, now: float | None = None) -> str:
    """MLflow's status, with a trial's fate when that says more (pruned, failed, interrupted); a
    RUNNING run whose driver stopped beating is shown as failed."""
    if heartbeat.lost(run.status, run.tags, now):
        return "FAILED (driver lost)"
    fate = run.tags.get(FATE_TAG, "")
    return f"{run.status} ({fate})" if fate in ("pruned", "failed", "interrupted") else run.status


def checkpoint(run: RunSummary) -> str:
    """The run's final checkpoint, else its latest local one; an evaluation: the one it scored."""
    if CHECKPOINT_TAG in run.tags or "checkpoint" in run.params:
        return run.tags.get(CHECKPOINT_TAG) or run.params["checkpoint"]
    storage, name = config_value(run, "checkpoint.storage_path", ""), run.params.get("train.run_name", "")
    if not storage or not name or "://" in storage:
        return ""
    # imported here: it imports torch, which `urm-ray runs` otherwise never needs
    from urm_ray.train.checkpoint import latest_local

    latest = latest_local(Path(storage) / name)
    return str(latest) if latest else ""


def config_value(run: RunSummary, key: str, default: str) -> str:
    """The run's config value of ``key``: its param, or the value a resume changed it to (under
    the key's old name for a run recorded before the key was renamed)."""
    for name in (key, *(old for old, new in RENAMED.items() if new == key)):
        value = run.tags.get(f"{RESUMED_TAG_PREFIX}{name}", run.params.get(name))
        if value is not None:
            return value
    return default


def train_row(uri: str, run: RunSummary, now: float | None = None) -> list[str]:
    handle = tracking.Run(uri, run.run_id)
    steps = [step for step, _ in handle.metric_history(STEP_KEY)]
    total = config_value(run, "train.steps", "?")
    values = [value for _, value in handle.metric_history(METRIC)]
    return [run.experiment, run.run_name, kind(run), state(run, now),
            f"{max(steps)}/{total}" if steps else "-", _value(max(values)) if values else "-",
            checkpoint(run)]


def sweep_row(run: RunSummary, trials: list[RunSummary], now: float | None = None) -> list[str]:
    """A sweep: trials finished of requested; its best objective value (the logged ``best/``
    metric of a finished sweep, else the best of its trials so far)."""
    metric, _, mode = run.params.get("objectives", METRIC).split(",")[0].partition(" (")
    mode = mode.rstrip(")") or "max"
    finished = sum(FATE_TAG in t.tags for t in trials)
    best = run.metrics.get(f"best/{metric}")
    scored = [t for t in trials if metric in t.metrics]
    if best is None and scored:
        pick = max if mode == "max" else min
        top = pick(scored, key=lambda t: t.metrics[metric])
        best_text = f"{_value(top.metrics[metric])} (t{int(top.tags.get(TRIAL_TAG, -1)):03d})"
    else:
        best_text = "-" if best is None else _value(best)
    if metric != METRIC and best_text != "-":
        best_text += f" {metric}"
    return [run.experiment, run.run_name, "sweep", state(run, now),
            f"{finished}/{run.params.get('trials', '?')}", best_text, ""]


def list_runs(tracking_uri: str, experiment: str = "", limit: int = 50,
              now: float | None = None) -> str:
    """The table of the ``limit`` newest runs of ``experiment``; with no experiment, the newest
    top-level runs of every experiment (a sweep is one row, whatever its number of trials).
    Heartbeats are judged at ``now`` (default: the current time)."""
    local = tracking_uri.removeprefix("sqlite:///")
    if local != tracking_uri and not Path(local).is_file():  # opening it would create it
        raise ConfigError(f"no MLflow store at {tracking_uri}; run `urm-ray runs` where you trained, "
                          "or pass --tracking-uri (or set MLFLOW_TRACKING_URI)")
    rows = []
    for run in tracking.search_runs(tracking_uri, experiment, max_results=limit, top_level=not experiment):
        if kind(run) == "sweep":
            trials = tracking.child_runs(tracking_uri, run.experiment, run.run_id)
            rows.append(sweep_row(run, [t for t in trials if kind(t) == "trial"], now))
        else:
            rows.append(train_row(tracking_uri, run, now))
    return render(rows, HEADER)


def ui_hint(tracking_uri: str, experiment: str = "") -> str:
    """Where MLflow's UI lists the runs: one link per experiment (``tracking.ui_url``), after the
    command that serves a local store."""
    pages = tracking.experiments_with_runs(tracking_uri, experiment)
    remote = tracking_uri.startswith(("http://", "https://"))
    lines = ["MLflow UI:" if remote else f"MLflow UI: mlflow ui --backend-store-uri {tracking_uri}, then open"]
    width = max(map(len, pages), default=0)
    lines += [f"  {name:{width}s}  {tracking.ui_url(tracking_uri, experiment_id)}"
              for name, experiment_id in pages.items()]
    return "\n".join(lines)
