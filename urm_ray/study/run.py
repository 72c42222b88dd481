"""Run a study: each row's sweep, its re-check over seeds, its winner trained over seeds; then
the table (``studies/<name>/table.md``, ``table.csv`` and MLflow).

    urm-ray study studies/sudoku4-families.yaml          # runs it, or goes on where it stopped

A study's state is what its stages leave behind, so running it again after a kill (Ctrl-C, a
lost machine, SIGKILL) redoes nothing finished:

- the sweeps, ``<root>/<study>/sweeps/<study>-<row>/``: created once, resumed by the sweep's own
  resume when they have fewer finished trials than their budget, skipped when complete;
- each row's re-check, ``rows/<row>/recheck.json``: written once all its runs are done (its
  runs, named ``<sweep>-final-tNNN-sK`` as ``urm-ray final`` names them, resume from their
  checkpoints when it is run again);
- the finals: one MLflow run per seed, ``<sweep>-study-s<seed>``, skipped when FINISHED, else
  trained (a cut one resumes from its last checkpoint).

Rows run side by side, each in a Ray task that drives its sweep, when the cluster has room for
every sweep's concurrent trials at once (``rows_at_once``); else one after another.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import statistics
from pathlib import Path
from typing import Any

import ray
from optuna.trial import FrozenTrial

from urm_ray import tracking
from urm_ray.cluster import init_ray
from urm_ray.config import build_config, resolve_tracking_uri, with_values
from urm_ray.errors import Interrupted
from urm_ray.report import REPORT_FILE, publish_after_sweep, write_study
from urm_ray.report.data import seed_curves
from urm_ray.study.baselines import published
from urm_ray.study.spec import Row, Study, final_overrides, load_study
from urm_ray.study.table import Cell, StudyTable, TableRow
from urm_ray.tracking import KIND_TAG, PARENT_TAG, SWEEP_TAG, TRIAL_TAG
from urm_ray.tune.best import reevaluate, top_trials
from urm_ray.tune.cost import DEVICE_SECONDS
from urm_ray.tune.info import INFO_FILE, SweepInfo
from urm_ray.tune.resources import trial_bundles, without_resources
from urm_ray.tune.space import SearchSpace
from urm_ray.tune.sweep import create_sweep, load_sweep, run_sweep

logger = logging.getLogger(__name__)

DEFAULT_ROOT = "studies"
STUDY_TAG = "urm_ray.study"
ROW_TAG = "urm_ray.study_row"
SEED_TAG = "urm_ray.seed"
RECHECK_FILE = "recheck.json"
WALL_TIME = "wall time x workers"


def run_study(study: Study, root: str = DEFAULT_ROOT, verbose: bool = False) -> StudyTable:
    """Run (or go on with) every row, then write and log the table."""
    folder = Path(root).resolve() / study.name
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        # the stores are created here, once: rows side by side would race to create their tables
        for uri in {resolve_tracking_uri(r.space.base_config.tracking.tracking_uri) for r in study.rows}:
            stack.enter_context(tracking.store_opening(uri))
        if not ray.is_initialized():
            init_ray(verbose=verbose)
    at_once = rows_at_once(study.rows, ray.cluster_resources())
    print(f"study {study.name}: {len(study.rows)} row(s), {at_once} at a time "
          f"({describe_room(study.rows, ray.cluster_resources())})", flush=True)
    if at_once > 1:
        _side_by_side(study, folder, at_once, verbose)
    else:
        for row in study.rows:
            run_row(study, row, folder, verbose)
            print(f"study {study.name}: row {row.name} done", flush=True)
    table = build_table(study, folder)
    write_table(table, folder)
    write_page(study, table, folder)
    log_table(study, table, folder)
    return table


def _demand(row: Row) -> tuple[float, float]:
    """(CPUs, GPUs) the row's sweep asks for with all its concurrent trials running, the CPU its
    trials' data loading keeps free included (as the sweep asks an autoscaler for them)."""
    spec = row.space.spec
    bundles = trial_bundles(spec.resources, min(spec.concurrency or spec.trials, spec.trials))
    return sum(b.get("CPU", 0.0) for b in bundles), sum(b.get("GPU", 0.0) for b in bundles)


def rows_at_once(rows: list[Row], cluster: dict[str, float]) -> int:
    """How many rows run side by side: the most whose sweeps' concurrent trials all fit the
    cluster's CPUs and GPUs together (the heaviest rows counted first); at least one."""
    cpus, gpus = cluster.get("CPU", 0.0), cluster.get("GPU", 0.0)
    used_cpus = used_gpus = 0.0
    count = 0
    for need_cpus, need_gpus in sorted((_demand(r) for r in rows), reverse=True):
        used_cpus, used_gpus = used_cpus + need_cpus, used_gpus + need_gpus
        if used_cpus > cpus or used_gpus > gpus:
            break
        count += 1
    return max(1, count)


def describe_room(rows: list[Row], cluster: dict[str, float]) -> str:
    needs = ", ".join(f"{r.name} {c:g} CPU{f' {g:g} GPU' if g else ''}" for r, (c, g) in
                      zip(rows, (_demand(r) for r in rows)))
    return f"cluster {cluster.get('CPU', 0):g} CPU, {cluster.get('GPU', 0):g} GPU; each sweep at full concurrency: {needs}"


def _side_by_side(study: Study, folder: Path, at_once: int, verbose: bool) -> None:
    """Each row in a Ray task (it drives its sweep and trains its finals), ``at_once`` at a time."""
    remote = ray.remote(num_cpus=0, max_retries=0)(_row_task)
    waiting = list(study.rows)
    running: dict[Any, str] = {}
    try:
        while waiting or running:
            while waiting and len(running) < at_once:
                row = waiting.pop(0)
                running[remote.remote(str(study.path), row.name, str(folder), os.getcwd(), verbose)] = row.name
            done, _ = ray.wait(list(running), num_returns=1)
            name = running.pop(done[0])
            try:
                ray.get(done[0])
            except ray.exceptions.RayTaskError as err:
                raise err.as_instanceof_cause() from None
            print(f"study {study.name}: row {name} done", flush=True)
    finally:
        for ref in running:  # Ctrl-C or a failed row: the others stop (and resume on the next run)
            ray.cancel(ref, force=True)


def _row_task(study_path: str, row_name: str, folder: str, cwd: str, verbose: bool) -> None:
    os.chdir(cwd)  # relative paths of the study (its data, spaces) as the command saw them
    study = load_study(study_path)
    row = next(r for r in study.rows if r.name == row_name)
    run_row(study, row, Path(folder), verbose)


def run_row(study: Study, row: Row, folder: Path, verbose: bool = False) -> None:
    """The row's sweep, its re-check and its finals, each skipped when done."""
    info, space = _sweep(study, row, folder / "sweeps", verbose)
    winner = _winner(study, row, info, space, folder / "rows" / row.name)
    for seed in final_seeds(study, space):
        _final(study, row, info, space, winner, seed)


def final_seeds(study: Study, space: SearchSpace) -> list[int]:
    """The final runs' seeds: after the base config's, as ``urm-ray final``'s re-check counts."""
    base = space.base_config.train.seed
    return [base + 1 + k for k in range(study.spec.protocol.seeds)]


def _sweep(study: Study, row: Row, root: Path, verbose: bool) -> tuple[SweepInfo, SearchSpace]:
    name = study.sweep_name(row)
    if (root / name / INFO_FILE).is_file():
        info, space = load_sweep(name, str(root))
        if _finished(info) >= space.spec.trials:
            _close_parent(info)
            return info, space
        resume = True
    else:
        info, space = create_sweep(row.space_file, row.sweep_overrides, name, str(root))
        resume = False
    outcome = run_sweep(info, space, resume=resume, verbose=verbose)
    publish_after_sweep(info, space)
    if outcome.interrupted:
        raise Interrupted(f"study {study.name}: sweep {name} stopped; run the study again to go on")
    return info, space


def _close_parent(info: SweepInfo) -> None:
    """A sweep stopped between its last trial and closing its MLflow run: closed now."""
    parent = tracking.Run(info.tracking_uri, info.parent_run_id)
    if info.parent_run_id and parent.summary().status == "RUNNING":
        parent.close("FINISHED")


def _finished(info: SweepInfo) -> int:
    return sum(t.state.is_finished() for t in info.study().get_trials(deepcopy=False))


def _winner(study: Study, row: Row, info: SweepInfo, space: SearchSpace, folder: Path) -> FrozenTrial:
    """The best of the sweep's top trials by their mean over the re-check's seeds (recorded in
    ``recheck.json`` once, so a resumed study trains the same winner)."""
    path = folder / RECHECK_FILE
    trials = {t.number: t for t in info.study().trials}
    if path.is_file():
        return trials[json.loads(path.read_text())["winner"]]
    protocol = study.spec.protocol
    candidates = top_trials(info, space, protocol.top)
    if len(candidates) > 1 or protocol.recheck_seeds > 1:
        parent = tracking.Run.open(
            info.tracking_uri, info.experiment, f"{info.name}-study-recheck",
            {"top": len(candidates), "seeds": protocol.recheck_seeds},
            {PARENT_TAG: info.parent_run_id, KIND_TAG: "final", SWEEP_TAG: info.name, STUDY_TAG: study.name},
        )
        scores = reevaluate(info, space, candidates, protocol.recheck_seeds, parent)
        parent.close("FINISHED")
    else:
        scores = {candidates[0].number: [float(candidates[0].values[0])]}
    sign = 1.0 if space.mode == "max" else -1.0
    winner = max(candidates, key=lambda t: sign * statistics.fmean(scores[t.number]))
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps({"winner": winner.number, "metric": space.metric,
                                   "scores": {str(k): v for k, v in scores.items()}}, indent=1))
    partial.replace(path)  # whole or absent: a kill while writing leaves no half a file
    return winner


def final_run_name(info: SweepInfo, seed: int) -> str:
    return f"{info.name}-study-s{seed}"


def _final(study: Study, row: Row, info: SweepInfo, space: SearchSpace, winner: FrozenTrial,
           seed: int) -> None:
    """One seed of the winner at full length, as ``urm-ray final`` trains it; skipped when its
    MLflow run is FINISHED."""
    from urm_ray.train.driver import fit

    name = final_run_name(info, seed)
    run = tracking.Run.find(info.tracking_uri, info.experiment, name)
    if run is not None and run.summary().status == "FINISHED":
        return
    values = {**dict(winner.params), **without_resources(info.trial_overrides),
              **final_overrides(study.spec.protocol, space),
              "train.seed": seed, "data.shuffle_seed": seed, "train.run_name": name,
              "checkpoint.storage_path": info.runs_path("final"), "tracking.tracking_uri": info.tracking_uri,
              "tracking.experiment": info.experiment}
    cfg = build_config(with_values(space.base, values))
    tags = {PARENT_TAG: info.parent_run_id, KIND_TAG: "study", SWEEP_TAG: info.name,
            TRIAL_TAG: str(winner.number), STUDY_TAG: study.name, ROW_TAG: row.name, SEED_TAG: str(seed)}
    logger.info("study %s: row %s, final seed %d (trial t%03d)", study.name, row.name, seed, winner.number)
    fit(cfg, tags=tags, params={f"sampled.{k}": v for k, v in winner.params.items()})


def final_runs(info: SweepInfo, study: str, row: str) -> list[tracking.RunSummary]:
    """The row's FINISHED final runs, by seed."""
    runs = tracking.matching_runs(info.tracking_uri, info.experiment,
                                  f"tags.`{STUDY_TAG}` = '{study}' and tags.`{ROW_TAG}` = '{row}' "
                                  "and attributes.status = 'FINISHED'")
    return sorted(runs, key=lambda r: int(r.tags[SEED_TAG]))


def build_table(study: Study, folder: Path) -> StudyTable:
    """The table, read back from MLflow: the final runs' last metrics, the runs' costs."""
    rows = []
    for row in study.rows:
        info, _ = load_sweep(study.sweep_name(row), str(folder / "sweeps"))
        runs = final_runs(info, study.name, row.name)
        cells = {m: Cell(m, tuple(r.metrics[m] for r in runs if m in r.metrics))
                 for m in study.spec.protocol.metrics}
        hours, sources = device_hours(info)
        benchmark = row.spec.benchmark
        rows.append(TableRow(row.name, row.spec.task or row.space.base_config.data.path, row.spec.family,
                             benchmark, info.name, cells, tuple(int(r.tags[SEED_TAG]) for r in runs),
                             hours, " and ".join(sources),
                             tuple(published(row.spec.family, benchmark)) if benchmark else ()))
    return StudyTable(study.name, list(study.spec.protocol.metrics), rows)


def device_hours(info: SweepInfo) -> tuple[float, list[str]]:
    """Device-hours of every training run of the sweep (trials, re-checks, finals): a run's
    ``cost/device_seconds`` where it logged one, else its wall time x its workers."""
    seconds, sources = 0.0, set()
    for run in tracking.matching_runs(info.tracking_uri, info.experiment):
        if TRIAL_TAG not in run.tags:  # the sweep's and re-check's parent runs train nothing
            continue
        if DEVICE_SECONDS in run.metrics:
            seconds += run.metrics[DEVICE_SECONDS]
            sources.add(DEVICE_SECONDS)
        else:
            end = run.end_ms or run.start_ms
            workers = int(run.params.get("resources.num_workers", 1))
            seconds += workers * (end - run.start_ms) / 1000.0
            sources.add(WALL_TIME)
    return seconds / 3600.0, sorted(sources)


def write_table(table: StudyTable, folder: Path) -> None:
    for name, text in (("table.md", table.to_markdown()), ("table.csv", table.to_csv())):
        partial = folder / f".{name}.tmp"
        partial.write_text(text)
        partial.replace(folder / name)


def write_page(study: Study, table: StudyTable, folder: Path) -> Path:
    """``report.html``: the table and, per row, the first metric's learning curves over the final
    seeds (``urm_ray/report/``)."""
    curves = {}
    for row in study.rows:
        info, _ = load_sweep(study.sweep_name(row), str(folder / "sweeps"))
        run_ids = [r.run_id for r in final_runs(info, study.name, row.name)]
        curves[row.name] = seed_curves(info.tracking_uri, run_ids, table.metrics[0])
    return write_study(table.study, table.metrics[0], table.page_rows(), curves, folder / REPORT_FILE)


def log_table(study: Study, table: StudyTable, folder: Path) -> str:
    """A parent run ``<study>`` in experiment ``study-<study>`` with the table as artifacts, and
    a child run per row with its metrics' mean, sd and interval. Returns the parent's id."""
    uri = load_sweep(study.sweep_name(study.rows[0]), str(folder / "sweeps"))[0].tracking_uri
    experiment = f"study-{study.name}"
    parent = tracking.Run.open(uri, experiment, study.name,
                               {"rows": len(study.rows), "seeds": study.spec.protocol.seeds,
                                "trials": study.spec.protocol.trials, "top": study.spec.protocol.top,
                                "study_file": str(study.path)},
                               {KIND_TAG: "study", STUDY_TAG: study.name})
    for row in table.rows:
        child = tracking.Run.open(uri, experiment, f"{study.name}-{row.name}",
                                  {"sweep": row.sweep, "family": row.family, "task": row.task,
                                   "benchmark": row.benchmark or "-", "cost_source": row.cost_source},
                                  {PARENT_TAG: parent.id, KIND_TAG: "study-row", STUDY_TAG: study.name,
                                   ROW_TAG: row.name})
        child.log_metrics(table.row_metrics(row))
        child.close("FINISHED")
    for name in ("table.md", "table.csv", REPORT_FILE):
        parent.log_artifact(folder / name)
    parent.close("FINISHED")
    return parent.id
