"""Audit a sweep after it ended (or was interrupted): do its three records of trials agree?

    from urm_ray.tune.audit import audit_sweep
    from urm_ray.tune.sweep import load_sweep
    report = audit_sweep(load_sweep("qs")[0], requested=8)
    print(report.render()); assert report.ok

A sweep keeps each trial three times: an Optuna trial in its study, a nested MLflow run under
its parent run, and a Tune trial in Tune's experiment state (``<sweep>/tune/``). The invariants:

- the study, the nested runs and Tune each hold exactly the requested number of trials, and each
  requested trial number 0..N-1 has its Optuna trial and its MLflow run (none lost);
- no Optuna trial left RUNNING or WAITING, no Tune trial left unfinished;
- every nested run has a fate tag (``urm_ray.fate``), none of them ``interrupted``;
- no run of the sweep's experiment logged a metric twice at one step.

The duplicate steps are counted in SQL when the MLflow store is a database (one query, however
many runs); through the client's metric histories otherwise (one call per run and key).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy
from optuna.trial import TrialState
from ray.tune.experiment import Trial
from sqlalchemy.pool import NullPool

from urm_ray import tracking
from urm_ray.tracking import FATE_TAG, PARENT_TAG, TRIAL_TAG
from urm_ray.tune.info import SweepInfo
from urm_ray.tune.search import TRIAL_KEY
from urm_ray.tune.trial import INTERRUPTED

TUNE_STATE = "experiment_state-*.json"  # Tune's snapshot; the newest name is the latest
_FINISHED_TUNE = (Trial.TERMINATED, Trial.ERROR)
_UNFINISHED_OPTUNA = (TrialState.RUNNING.name, TrialState.WAITING.name)
_SHOWN = 8  # trial numbers listed per problem in the text
_RUNS_MAX = 50_000  # MLflow's largest page of search_runs

# (run name, metric key, step, times logged) of every step a run logged more than once
_DUPLICATES_SQL = sqlalchemy.text("""
    SELECT r.name, m.key, m.step, count(*) FROM metrics m
    JOIN runs r ON r.run_uuid = m.run_uuid
    JOIN experiments e ON e.experiment_id = r.experiment_id
    WHERE e.name = :experiment
    GROUP BY r.name, m.key, m.step HAVING count(*) > 1
    ORDER BY r.name, m.key, m.step""")


@dataclass(frozen=True)
class DuplicateStep:
    run: str  # MLflow run name
    key: str
    step: int
    times: int


@dataclass
class SweepAudit:
    """What the three records of a sweep hold; ``problems`` lists each broken invariant."""

    name: str
    requested: int
    optuna: dict[str, int]  # Optuna state -> trials
    tune: dict[str, int]  # Tune status -> trials
    mlflow_runs: int  # runs nested under the sweep's parent run
    fates: dict[str, int]  # fate tag -> nested runs
    without_fate: list[int]  # trial numbers whose run has no fate tag
    no_optuna_trial: list[int]  # requested numbers the study lacks
    no_mlflow_run: list[int]  # requested numbers without a nested run
    extra_runs: list[int]  # trial numbers with more than one nested run
    duplicate_steps: list[DuplicateStep]
    seconds: float = 0.0  # how long the audit took
    notes: list[str] = field(default_factory=list)  # records that could not be read

    @property
    def optuna_trials(self) -> int:
        return sum(self.optuna.values())

    @property
    def tune_trials(self) -> int:
        return sum(self.tune.values())

    @property
    def problems(self) -> list[str]:
        n = self.requested
        found = [
            (self.optuna_trials != n, f"{self.optuna_trials} Optuna trials, {n} requested"),
            (self.mlflow_runs != n, f"{self.mlflow_runs} nested MLflow runs, {n} requested"),
            (self.tune_trials != n, f"{self.tune_trials} Tune trials, {n} requested"),
            (bool(self.no_optuna_trial), f"no Optuna trial: {_numbers(self.no_optuna_trial)}"),
            (bool(self.no_mlflow_run), f"no MLflow run: {_numbers(self.no_mlflow_run)}"),
            (bool(self.extra_runs), f"more than one MLflow run: {_numbers(self.extra_runs)}"),
            (bool(self.without_fate), f"no fate tag: {_numbers(self.without_fate)}"),
            (self.fates.get(INTERRUPTED, 0) > 0, f"{self.fates.get(INTERRUPTED, 0)} runs still "
                                                 f"{INTERRUPTED} (resume the sweep)"),
            (bool(self.duplicate_steps), f"{len(self.duplicate_steps)} metric steps logged more "
                                         f"than once{_first(self.duplicate_steps)}"),
        ]
        unfinished = {s: c for s, c in self.optuna.items() if s in _UNFINISHED_OPTUNA}
        if unfinished:
            found.append((True, f"Optuna trials not finished: {unfinished}"))
        open_tune = {s: c for s, c in self.tune.items() if s not in _FINISHED_TUNE}
        if open_tune:
            found.append((True, f"Tune trials not finished: {open_tune}"))
        return [text for broken, text in found if broken] + self.notes

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        lines = [
            f"sweep {self.name}: {self.requested} trials requested (audited in {self.seconds:.1f} s)",
            f"  Optuna trials      {self.optuna_trials:6d}  {_counts(self.optuna)}",
            f"  MLflow nested runs {self.mlflow_runs:6d}  {_counts(self.fates)}",
            f"  Tune trials        {self.tune_trials:6d}  {_counts(self.tune)}",
            f"  lost               {len(set(self.no_optuna_trial) | set(self.no_mlflow_run)):6d}",
            f"  without a fate     {len(self.without_fate):6d}",
            f"  duplicate steps    {len(self.duplicate_steps):6d}",
        ]
        lines += [f"  PROBLEM: {p}" for p in self.problems] or ["  ok"]
        return "\n".join(lines)


def audit_sweep(info: SweepInfo, requested: int) -> SweepAudit:
    """Read the sweep's study, nested MLflow runs and Tune state and compare them.

    ``requested``: the sweep's number of trials (``SearchSpace.spec.trials``).
    """
    start = time.perf_counter()
    frozen = info.study().get_trials(deepcopy=False)
    optuna_numbers = {t.number for t in frozen}
    # one search for the experiment's runs (child_runs reads each run once more)
    runs = [r for r in tracking.search_runs(info.tracking_uri, info.experiment, max_results=_RUNS_MAX)
            if r.tags.get(PARENT_TAG) == info.parent_run_id]
    run_numbers = Counter(int(r.tags[TRIAL_TAG]) for r in runs if TRIAL_TAG in r.tags)
    wanted = range(requested)
    tune, notes = tune_statuses(info.path / "tune")
    audit = SweepAudit(
        name=info.name, requested=requested,
        optuna=dict(Counter(t.state.name for t in frozen)),
        tune=tune,
        mlflow_runs=len(runs),
        fates=dict(Counter(r.tags[FATE_TAG] for r in runs if FATE_TAG in r.tags)),
        without_fate=sorted(int(r.tags.get(TRIAL_TAG, -1)) for r in runs if FATE_TAG not in r.tags),
        no_optuna_trial=[n for n in wanted if n not in optuna_numbers],
        no_mlflow_run=[n for n in wanted if n not in run_numbers],
        extra_runs=sorted(n for n, count in run_numbers.items() if count > 1),
        duplicate_steps=duplicate_steps(info.tracking_uri, info.experiment),
        notes=notes,
    )
    audit.seconds = time.perf_counter() - start
    return audit


def tune_statuses(folder: Path) -> tuple[dict[str, int], list[str]]:
    """Tune status -> trials in the newest experiment snapshot of ``folder`` (the sweep's
    ``tune/``), read without starting Ray; and a note when there is no snapshot."""
    snapshots = sorted(folder.glob(TUNE_STATE))
    if not snapshots:
        return {}, [f"no Tune experiment state in {folder}"]
    state = json.loads(snapshots[-1].read_text())
    statuses: Counter[str] = Counter()
    for trial_json, _metadata in state["trial_data"]:
        trial = Trial.from_json_state(trial_json, stub=True)
        assert TRIAL_KEY in trial.config, f"a Tune trial without {TRIAL_KEY}: {trial.config}"
        statuses[trial.status] += 1
    return dict(statuses), []


def duplicate_steps(tracking_uri: str, experiment: str) -> list[DuplicateStep]:
    """Every (run, key, step) of the experiment's runs logged more than once."""
    if tracking_uri.split(":", 1)[0].split("+")[0] in ("sqlite", "postgresql", "mysql", "mssql"):
        return duplicates_in_sql(tracking_uri, experiment)
    return duplicates_by_client(tracking_uri, experiment)


def duplicates_in_sql(tracking_uri: str, experiment: str) -> list[DuplicateStep]:
    """One query on MLflow's database, whatever the number of runs."""
    engine = sqlalchemy.create_engine(tracking_uri, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(_DUPLICATES_SQL, {"experiment": experiment}).all()
    finally:
        engine.dispose()
    return [DuplicateStep(name, key, int(step), int(times)) for name, key, step, times in rows]


def duplicates_by_client(tracking_uri: str, experiment: str) -> list[DuplicateStep]:
    """Through MLflow's client (an http:// server): one call per run and metric key."""
    found = []
    for run in sorted(tracking.search_runs(tracking_uri, experiment, max_results=_RUNS_MAX),
                      key=lambda r: r.run_name):
        handle = tracking.Run(tracking_uri, run.run_id)
        for key in sorted(run.metrics):
            steps = Counter(step for step, _ in handle.metric_history(key))
            found += [DuplicateStep(run.run_name, key, s, c) for s, c in sorted(steps.items()) if c > 1]
    return found


def _first(duplicates: list[DuplicateStep]) -> str:
    d = duplicates[0] if duplicates else None
    return f", e.g. {d.key} at step {d.step} of {d.run}, {d.times} times" if d else ""


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(counts.items()))


def _numbers(numbers: list[int]) -> str:
    shown = ", ".join(f"t{n:03d}" for n in numbers[:_SHOWN])
    return shown + (f" and {len(numbers) - _SHOWN} more" if len(numbers) > _SHOWN else "")
