"""A sweep of a thousand trials on a local multi-node Ray cluster: what it costs, and whether its
records still agree at the end.

    python bench/sweep_scale.py --json scale.json                       # the full run, about an hour
    python bench/sweep_scale.py --trials 60 --concurrency 8 --nodes 4 --cpus-per-node 2 \
        --cpus-per-trial 0.5 --kill-at 30 --profile --json small.json   # a small one

Everything runs on this machine: a Ray cluster of ``--nodes`` logical nodes (``ray.cluster_utils.
Cluster``, ``--cpus-per-node`` logical CPUs each), a PostgreSQL server (tests/postgres.py, fsync
on) holding the Optuna study and the MLflow store (two databases), and a real ``urm-ray sweep``
(a subprocess joining the cluster through RAY_ADDRESS) of ``--trials`` tiny trials (hidden 16, one
layer, ``--steps`` steps, evaluated every 10), ``--concurrency`` at a time, ASHA on, ``--retries``
retries. In the same run, in this order:

1. Ray Tune's floor: as many trials that each sleep 1 s and report once, at the same concurrency,
   on the same cluster (a plain ``tune.Tuner``, ``reuse_actors=True``, run from this process).
2. The sweep. Once ``--remove-at`` trials have finished, 2 worker nodes are removed (their trials
   fail and retry); ``--add-after`` seconds later, 2 fresh nodes join. A probe process logs metric
   batches into the same MLflow database all along and times them. Once ``--kill-at`` trials
   have finished the sweep's driver is SIGKILLed, and ``urm-ray sweep --resume`` finishes it.
3. TPE's suggest latency with 10, 100 and 1,000 finished trials in the study; database and
   folder sizes; the audit of the sweep's records (``urm_ray.tune.audit``).

Reported (printed; ``--json`` also writes it):

- trials per hour, of the sweep (both drivers' time) and of the floor;
- the driver's CPU seconds per trial (``/proc/<pid>/stat`` of both sweep drivers; the floor's:
  this process's CPU time while it ran);
- per-trial overhead p50 / p99, and as a ratio to the floor's: a trial's slot minus its own work.
  The slot of a trial is its end minus the end of the trial before it on the same trial actor
  (the same pid), or its own ``time_total_s`` if it is the actor's first. Its end is its last
  Tune result (``result.json``: ``pid``, ``timestamp``, ``time_total_s``); Tune stamps results to
  the second, so a sweep trial's end is taken from its last MLflow metric (milliseconds, logged
  just before that result) and the floor's trials stamp their result with ``time.time()``. Own
  work: ``time/train_s`` + ``time/eval_s`` (the floor: its sleep). Trials that ran on more than
  one actor (retried, or restarted by the resume) are left out and counted;
- resident memory of the trial actors (``ps``, every second: per actor, and all of them), and
  their CPU seconds per trial (``/proc/<pid>/stat`` of each at its last sample);
- the suggest latency (the first n finished trials copied into a fresh study on the same
  storage, then the space's define-by-run ``ask`` timed, as ``SweepSearch.suggest`` does);
- MLflow latency p50 / p99 while the sweep runs: ``log_batch`` of 20 metrics, and finding a run
  by its name tag (what each trial and the driver's fate recorder do), early and late;
- the largest number of PostgreSQL connections;
- sizes: both databases (``pg_database_size``), MLflow's artifacts, Tune's state folder;
- the resume: from its start to the first new training step logged to MLflow and to the first
  new Optuna trial, and to its end;
- the load average at start and end, the date, the machine;
- with ``--profile``: the resumed driver under cProfile (wall time of its main thread, Tune's
  loop), per call of what it does for each trial (suggest, Optuna's tell, the MLflow fate, ...).

The work folder (``--dir``, default a new temporary one) keeps the sweep, its logs
(``sweep-1.log``, ``sweep-2.log``) and the floor's Tune folder; it is removed at the end unless
``--keep``. Requires PostgreSQL's ``initdb`` and ``postgres`` (apt-get install postgresql).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml

ROOT = Path(__file__).resolve().parents[1]
# the tests' throwaway PostgreSQL server (tests/ is no package: loaded from its file)
_SPEC = importlib.util.spec_from_file_location("urm_ray_tests_postgres", ROOT / "tests" / "postgres.py")
postgres = sys.modules[_SPEC.name] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(postgres)

SWEEP = "scale"
FLOOR_SLEEP_S = 1.0
END_KEY = "end_s"  # the floor's results: unix time in the trial (Tune's "timestamp" is an int)
PROBE_EVERY_S = 0.5
PROBE_METRICS = 20  # keys per log_batch: about what a trial's report logs
SUGGEST_AT = (10, 100, 1000)  # finished trials in the study
SUGGEST_ASKS = 5  # asks timed at each size (median)
NODE_MEMORY = 256 * 1024**2  # object store per node: the trials share a few MB of data
MAX_CONNECTIONS = 500  # PostgreSQL: every trial actor keeps its own pooled connections
LOADED = 8.0  # 1-minute load average per core above which nodes do not join yet (see Sweep._add_nodes)
ADD_WAIT_S = 300.0  # the longest nodes wait for that load to pass
ACTOR_MIB = 700  # about the most a tiny trial's actor held here (torch, Ray, Ray Data, MLflow)
PROFILE = "driver-2.prof"
PROBE = "probe.json"


def scale_space(trials: int, concurrency: int, steps: int = 20, retries: int = 1,
                cpus_per_trial: float = 1.0, workers: int = 1) -> dict[str, Any]:
    """A search space of tiny trials on the built-in 4x4 Sudoku: ASHA stops the weaker half of
    the trials at step 10; a trial checkpoints at each evaluation."""
    return {
        "description": "sweep scale: tiny URM trials on 4x4 Sudoku",
        "base": "sudoku4-urm",
        "overrides": {
            # the nodes of the test's logical cluster are processes of one machine: one disk
            "data.path": "builtin:sudoku4", "resources.shared_fs": True,
            "model.hidden_size": 16, "model.num_heads": 2,
            "model.num_layers": 1, "model.expansion": 1.0, "model.max_segments": 2,
            "train.steps": steps, "train.global_batch_size": 16, "train.log_every": 10,
            "eval.every": 10, "checkpoint.every": 10, "eval.max_rows": 16,
            "optim.warmup_steps": 1,
        },
        "params": {
            "model.loops": {"type": "int", "low": 2, "high": 3},
            "model.truncation": {"type": "int", "low": 0, "high": "model.loops - 1"},
            "optim.lr": {"type": "log_float", "low": 1.0e-4, "high": 3.0e-3},
        },
        "objectives": [{"metric": "eval/token_accuracy", "mode": "max"}],
        "trials": trials,
        "concurrency": concurrency,
        "retries": retries,
        "resources": {"workers": workers, "cpus_per_worker": cpus_per_trial / workers},
        "scheduler": {"name": "asha", "grace_steps": 10, "reduction_factor": 2},
        "search": {"sampler": "tpe", "seed": 0, "startup_trials": 10},
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_cluster(nodes: int, cpus_per_node: float) -> Any:
    """A head and ``nodes - 1`` worker nodes, all local processes with logical CPUs; the
    dashboard on a free port, named by RAY_API_SERVER_ADDRESS in this environment (which every
    process of the cluster and the sweep inherit: other Ray instances may run on this machine)."""
    from ray.cluster_utils import Cluster

    dashboard = free_port()
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{dashboard}"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": cpus_per_node, "include_dashboard": True, "dashboard_port": dashboard,
        "object_store_memory": NODE_MEMORY})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cpus_per_node, object_store_memory=NODE_MEMORY)
    cluster.wait_for_nodes()
    return cluster


def sweep_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "urm_ray.cli", "sweep", *args]


# --- per-trial overhead from Tune's result rows ----------------------------------------------------


@dataclass
class Segment:
    """The part of one trial that ran on one actor: its last result there."""

    trial: str
    actor: str  # hostname:pid
    end: float  # unix seconds
    total_s: float  # the trial's time_total_s at that result
    work_s: float  # the trial's own work up to that result


def overheads(segments: list[Segment]) -> tuple[dict[str, float], int]:
    """(trial -> overhead, of the trials that ran on one actor only; trials left out: ran on several).

    Slot = end minus the previous segment's end on the same actor, or ``total_s`` for an actor's
    first segment; overhead = slot - own work."""
    actors: dict[str, list[Segment]] = {}
    for seg in segments:
        actors.setdefault(seg.actor, []).append(seg)
    per_trial: dict[str, list[float]] = {}
    for segs in actors.values():
        previous = None
        for seg in sorted(segs, key=lambda s: s.end):
            slot = seg.end - previous if previous is not None else seg.total_s
            per_trial.setdefault(seg.trial, []).append(slot - seg.work_s)
            previous = seg.end
    single = {trial: values[0] for trial, values in per_trial.items() if len(values) == 1}
    return single, len(per_trial) - len(single)


def read_segments(tune_folder: Path, work_keys: tuple[str, ...], ends: dict[str, float] | None = None,
                  fixed_work: float = 0.0) -> list[Segment]:
    """The segments of every trial folder's ``result.json`` under ``tune_folder``. ``ends``: a
    more precise end of a trial's last result, by trial name (tNNN; kept when within 2 s of the
    result's own timestamp)."""
    segments: list[Segment] = []
    for results in sorted(tune_folder.glob("*/result.json")):
        rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
        last_by_actor: dict[str, dict[str, Any]] = {}
        for row in rows:
            last_by_actor[f"{row.get('hostname')}:{row['pid']}"] = row
        if not rows:
            continue
        # a sweep's trial by its Optuna number: a trial taken over after a resume gets a second
        # folder (tNNN_<id>) next to the one the killed driver had made
        number = rows[-1].get("config", {}).get("trial_number")
        trial = results.parent.name if number is None else f"t{int(number):03d}"
        for actor, row in last_by_actor.items():
            end = float(row.get(END_KEY, row["timestamp"]))
            precise = (ends or {}).get(trial)
            if row is rows[-1] and precise is not None and abs(precise - end) < 2.0:
                end = precise
            work = fixed_work + sum(float(row.get(k, 0.0)) for k in work_keys)
            segments.append(Segment(trial, actor, end, float(row["time_total_s"]), work))
    return segments


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "n": 0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": statistics.median(ordered), "p99": p99, "n": len(ordered)}


# --- Ray Tune's floor ------------------------------------------------------------------------------


def floor_trial(config: dict[str, Any]) -> None:
    from ray import tune

    time.sleep(FLOOR_SLEEP_S)
    tune.report({"slept_s": FLOOR_SLEEP_S, END_KEY: time.time()})  # Tune's timestamp: whole seconds


def run_floor(address: str, trials: int, concurrency: int, cpus: float, folder: Path) -> dict[str, Any]:
    """The same number of trials, each 1 s of sleep and one report, through a plain Tuner."""
    import ray
    from ray import tune

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        tuner = tune.Tuner(
            tune.with_resources(floor_trial, {"cpu": cpus}),
            tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=concurrency,
                                        reuse_actors=True),
            run_config=tune.RunConfig(name="floor", storage_path=str(folder), verbose=0),
        )
        cpu0, start = time.process_time(), time.monotonic()
        grid = tuner.fit()
        wall, cpu = time.monotonic() - start, time.process_time() - cpu0
    finally:
        ray.shutdown()
    values, left_out = overheads(read_segments(folder / "floor", (), fixed_work=FLOOR_SLEEP_S))
    return {"trials": len(grid), "errors": len(grid.errors), "wall_s": wall,
            "trials_per_hour": trials / wall * 3600, "driver_cpu_s_per_trial": cpu / trials,
            "overhead_s": percentiles(list(values.values())), "left_out": left_out}


# --- watching the sweep ------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def trial_actors(root: int) -> dict[int, int]:
    """pid -> RSS in KiB of each Tune trial actor under process ``root`` (this one: the cluster's
    nodes are its children; other Ray instances on the machine are not). Ray's process title is
    ``ray::ImplicitFunc`` for a function trainable, ``.train`` or ``.reset`` appended while busy."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,rss=,args="], capture_output=True, text=True).stdout
    parent, actors = {}, []
    for line in out.splitlines():
        pid, ppid, rss, args = line.split(None, 3)
        parent[int(pid)] = int(ppid)
        if args.startswith("ray::ImplicitFunc"):
            actors.append((int(pid), int(rss)))
    return {pid: rss for pid, rss in actors if _descends(pid, root, parent)}


def _descends(pid: int, root: int, parent: dict[int, int]) -> bool:
    while pid > 1:
        if pid == root:
            return True
        pid = parent.get(pid, 0)
    return False


class Databases:
    """The counts the bench polls, straight from PostgreSQL (one connection each)."""

    def __init__(self, optuna_url: str, mlflow_url: str) -> None:
        self.optuna = psycopg.connect(optuna_url, autocommit=True)
        self.mlflow = psycopg.connect(mlflow_url, autocommit=True)

    def finished(self) -> int:
        return _one(self.optuna, "SELECT count(*) FROM trials WHERE state IN "
                                 "('COMPLETE', 'PRUNED', 'FAIL')")

    def asked(self) -> int:
        return _one(self.optuna, "SELECT count(*) FROM trials")

    def last_metric_ms(self, experiment: str) -> int:
        return _one(self.mlflow, "SELECT coalesce(max(m.timestamp), 0) FROM metrics m JOIN runs r "
                                 "USING (run_uuid) JOIN experiments e ON e.experiment_id = "
                                 "r.experiment_id WHERE e.name = %s", (experiment,))

    def trial_ends(self, experiment: str) -> dict[str, float]:
        """Trial folder (tNNN) -> unix seconds of its run's last metric."""
        rows = self.mlflow.execute(
            "SELECT r.name, max(m.timestamp) FROM metrics m JOIN runs r USING (run_uuid) "
            "JOIN experiments e ON e.experiment_id = r.experiment_id WHERE e.name = %s "
            "GROUP BY r.name", (experiment,)).fetchall()
        return {name.rsplit("-", 1)[1]: ms / 1000 for name, ms in rows if "-t" in name}

    def connections(self) -> int:
        return self.optuna.execute("SELECT count(*) FROM pg_stat_activity").fetchone()[0]

    def sizes(self) -> dict[str, int]:
        return {name: self.optuna.execute("SELECT pg_database_size(%s)", (name,)).fetchone()[0]
                for name in ("optuna", "mlflow")}

    def close(self) -> None:
        self.optuna.close()
        self.mlflow.close()


def _one(conn: psycopg.Connection, query: str, params: tuple = ()) -> int:
    """A count; 0 while the store has not created its tables yet (the sweep creates them)."""
    try:
        return int(conn.execute(query, params).fetchone()[0])
    except psycopg.errors.UndefinedTable:
        return 0


@dataclass
class Watch:
    """What the bench samples every second while a sweep driver runs."""

    driver_cpu_s: float = 0.0  # of the drivers that have ended
    last_cpu: float = 0.0  # the running driver's CPU seconds at the latest sample
    cpu_by_finished: list[tuple[int, float]] = field(default_factory=list)  # (finished, CPU s so far)
    rss_kib: list[int] = field(default_factory=list)  # every sample of every trial actor
    rss_total_kib: int = 0  # the largest sum over one sample
    actors_max: int = 0
    connections_max: int = 0
    actor_cpu_s: dict[int, float] = field(default_factory=dict)  # trial actor pid -> its CPU s
    events: list[tuple[float, str]] = field(default_factory=list)  # (seconds since start, what)

    def sample(self, pid: int, finished: int, dbs: Databases) -> None:
        cpu = cpu_seconds(pid)
        if cpu is not None:
            self.last_cpu = cpu
        self.cpu_by_finished.append((finished, self.driver_cpu_s + self.last_cpu))
        actors = trial_actors(os.getpid())
        for pid in actors:
            self.actor_cpu_s[pid] = cpu_seconds(pid) or self.actor_cpu_s.get(pid, 0.0)
        rss = list(actors.values())
        self.rss_kib += rss
        self.rss_total_kib = max(self.rss_total_kib, sum(rss))
        self.actors_max = max(self.actors_max, len(rss))
        self.connections_max = max(self.connections_max, dbs.connections())

    def driver_ended(self) -> None:
        self.driver_cpu_s += self.last_cpu
        self.last_cpu = 0.0

    def cpu_per_trial_by_quarter(self, trials: int) -> list[float | None]:
        """The drivers' CPU seconds per finished trial while the first, second, ... quarter of
        the trials finished: a cost that grows with the trial count shows as a rising list."""
        quarters: list[float | None] = []
        for q in range(4):
            low, high = trials * q // 4, trials * (q + 1) // 4
            inside = [(f, c) for f, c in self.cpu_by_finished if low <= f <= high]
            if len(inside) < 2 or inside[-1][0] == inside[0][0]:
                quarters.append(None)
                continue
            quarters.append((inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]))
        return quarters


# --- the MLflow probe (its own process) --------------------------------------------------------------


def probe_mlflow(uri: str, sweep_experiment: str, out: str, stop: Any) -> None:
    """Log a batch of ``PROBE_METRICS`` metrics every ``PROBE_EVERY_S`` into a run of its own
    experiment, and look a sweep trial's run up by name, timing both until ``stop`` is set."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from urm_ray import tracking

    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("scale-probe")).info.run_id
    rows, step, start = [], 0, time.monotonic()
    while not stop.is_set():
        now = int(time.time() * 1000)
        began = time.perf_counter()
        client.log_batch(run_id, metrics=[Metric(f"probe/{k}", float(step), now, step)
                                          for k in range(PROBE_METRICS)])
        rows.append((time.monotonic() - start, "log_batch", time.perf_counter() - began))
        began = time.perf_counter()
        tracking.find_run_id(uri, sweep_experiment, f"{SWEEP}-t{step % 10:03d}")
        rows.append((time.monotonic() - start, "find_run", time.perf_counter() - began))
        step += 1
        stop.wait(PROBE_EVERY_S)
    Path(out).write_text(json.dumps(rows))


def probe_summary(path: Path) -> dict[str, Any]:
    rows = json.loads(path.read_text()) if path.exists() else []
    summary: dict[str, Any] = {}
    for kind in ("log_batch", "find_run"):
        times = [seconds * 1000 for _, k, seconds in rows if k == kind]
        fifth = max(1, len(times) // 5)
        summary[kind] = {"all_ms": percentiles(times), "first_fifth_ms": percentiles(times[:fifth]),
                         "last_fifth_ms": percentiles(times[-fifth:])}
    return summary


# --- the sweep, its kill and its resume -------------------------------------------------------------


@dataclass
class Phase:
    wall_s: float
    finished: int
    returncode: int | None
    first_step_s: float | None = None  # resume: to the first new training step in MLflow
    first_asked_s: float | None = None  # resume: to the first new Optuna trial


class Sweep:
    """Runs the sweep's drivers and does to the cluster what the arguments say, sampling as it goes."""

    def __init__(self, args: argparse.Namespace, cluster: Any, dbs: Databases, work: Path,
                 env: dict[str, str]) -> None:
        self.args, self.cluster, self.dbs, self.work, self.env = args, cluster, dbs, work, env
        self.watch = Watch()
        self.nodes_state = ""  # "removed", then "added"
        self.removed_at = (0.0, 0)  # (monotonic time, trials finished) when the nodes went
        self.nodes_out: dict[str, float] = {}  # how long, and the trials finished meanwhile
        self.nodes_to_add: int | None = None  # of the nodes to add back, those not started yet
        self.add_failures = 0  # node starts that timed out
        self.start = time.monotonic()

    def note(self, what: str) -> None:
        self.watch.events.append((round(time.monotonic() - self.start, 1), what))
        print(f"[{time.monotonic() - self.start:7.1f} s] {what}", flush=True)

    def first(self, space_file: Path) -> Phase:
        cmd = sweep_command([str(space_file), "--name", SWEEP, "--dir", str(self.work / "sweeps"),
                             "--storage", self.env["OPTUNA_URL"]])
        return self._drive(cmd, "sweep-1.log", kill_at=self.args.kill_at)

    def resume(self) -> Phase:
        cmd = sweep_command(["--resume", SWEEP, "--dir", str(self.work / "sweeps")])
        if self.args.profile:  # cProfile of the driver's main thread: Tune's loop, its callbacks
            cmd[1:3] = ["-m", "cProfile", "-o", str(self.work / PROFILE), "-m", "urm_ray.cli"]
        return self._drive(cmd, "sweep-2.log", kill_at=0)

    def _drive(self, cmd: list[str], log: str, kill_at: int) -> Phase:
        began, asked0 = time.monotonic(), self.dbs.asked()
        since_ms = int(time.time() * 1000)
        phase = Phase(0.0, 0, None)
        with open(self.work / log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=self.work, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            self.note(f"driver {proc.pid} started: {' '.join(cmd[1:])}")
            while proc.poll() is None:
                finished = self.dbs.finished()
                self.watch.sample(proc.pid, finished, self.dbs)
                self._nodes(finished)
                if phase.first_step_s is None and self.dbs.last_metric_ms(f"sweep-{SWEEP}") > since_ms:
                    phase.first_step_s = time.monotonic() - began
                if phase.first_asked_s is None and self.dbs.asked() > asked0:
                    phase.first_asked_s = time.monotonic() - began
                # not while nodes are out: the resume plans its concurrency on the cluster it finds
                if kill_at and finished >= kill_at and self.nodes_state != "removed":
                    proc.send_signal(signal.SIGKILL)
                    self.note(f"driver SIGKILLed with {finished} trials finished")
                    proc.wait()
                    break
                time.sleep(1.0)
        self.watch.driver_ended()
        phase.wall_s, phase.finished, phase.returncode = time.monotonic() - began, self.dbs.finished(), proc.returncode
        self.note(f"driver {proc.pid} ended ({proc.returncode}) with {phase.finished} trials finished")
        return phase

    def _nodes(self, finished: int) -> None:
        """Remove two worker nodes at ``--remove-at`` finished trials; ``--add-after`` seconds
        later two fresh ones join (as replacements for reclaimed spot nodes do)."""
        if not self.nodes_state and self.args.remove_at and finished >= self.args.remove_at:
            for node in list(self.cluster.worker_nodes)[-2:]:
                self.cluster.remove_node(node)
            self.nodes_state, self.removed_at = "removed", (time.monotonic(), finished)
            self.note(f"removed 2 nodes at {finished} trials finished")
        elif self.nodes_state == "removed" and time.monotonic() - self.removed_at[0] >= self.args.add_after:
            if not self._add_nodes(2):
                return
            self.nodes_state = "added"
            self.nodes_out = {"seconds": time.monotonic() - self.removed_at[0],
                              "finished_meanwhile": finished - self.removed_at[1],
                              "failed_starts": self.add_failures}
            self.note(f"2 nodes added back at {finished} trials finished")


    def _add_nodes(self, count: int) -> bool:
        """Start ``count`` fresh worker nodes; False to try again later. A raylet that does not
        register within Ray's fixed 30 s fails its start: on a machine loaded by the restart of
        the removed nodes' trials (load average 85 on 2 cores here) it does, so nodes join once
        the 1-minute load average is below ``LOADED`` per core (at most ``ADD_WAIT_S`` late), and
        a failed start is tried again (the failed node's processes are left to join late, or not)."""
        late = time.monotonic() - self.removed_at[0] - self.args.add_after
        if os.getloadavg()[0] > LOADED * (os.cpu_count() or 1) and late < ADD_WAIT_S:
            return False
        while self.nodes_to_add is None or self.nodes_to_add > 0:
            self.nodes_to_add = count if self.nodes_to_add is None else self.nodes_to_add
            try:
                self.cluster.add_node(num_cpus=self.args.cpus_per_node, object_store_memory=NODE_MEMORY)
            except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception on the timeout
                self.add_failures += 1
                self.note(f"a node failed to start ({err}); trying again")
                return False
            self.nodes_to_add -= 1
        return True


# --- after the sweep ----------------------------------------------------------------------------------


def suggest_latency(work: Path, finished_at: tuple[int, ...] = SUGGEST_AT) -> dict[str, float | None]:
    """Median ms of the space's define-by-run ask with the sweep's first n finished trials in a
    fresh study on the same storage (None: the sweep finished fewer than n)."""
    import optuna

    from urm_ray.tune.info import storage
    from urm_ray.tune.search import DefineByRun, make_sampler
    from urm_ray.tune.sweep import load_sweep

    info, space = load_sweep(SWEEP, str(work / "sweeps"))
    done = [t for t in info.study().get_trials(deepcopy=False) if t.state.is_finished()]
    done.sort(key=lambda t: t.number)
    define = DefineByRun(space)
    latency: dict[str, float | None] = {}
    for n in finished_at:
        if len(done) < n:
            latency[str(n)] = None
            continue
        study = optuna.create_study(study_name=f"{SWEEP}-suggest-{n}", storage=storage(info.storage),
                                    sampler=make_sampler(space), direction=f"{space.mode}imize")
        study.add_trials(done[:n])
        times = []
        for _ in range(SUGGEST_ASKS):
            began = time.perf_counter()
            define(study.ask())
            times.append((time.perf_counter() - began) * 1000)
        latency[str(n)] = statistics.median(times)
    return latency


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def machine() -> dict[str, Any]:
    memory = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpus": os.cpu_count(),
            "arch": platform.machine(), "memory_gib": round(int(memory.split()[1]) / 1024**2, 1),
            "load_average": os.getloadavg()}


def ratio(value: float | None, floor: float | None) -> float | None:
    return value / floor if value is not None and floor else None


def summarize(args: argparse.Namespace, sweep: Sweep, phases: list[Phase], floor: dict[str, Any],
              extra: dict[str, Any]) -> dict[str, Any]:
    """The report's figures from what the run gathered."""
    wall = sum(p.wall_s for p in phases)
    values, left_out = overheads(extra.pop("segments"))
    trial_overhead = percentiles(list(values.values()))
    watch = sweep.watch
    return {
        "sweep": {
            "trials": args.trials, "concurrency": args.concurrency, "wall_s": wall,
            "trials_per_hour": args.trials / wall * 3600,
            "driver_cpu_s_per_trial": watch.driver_cpu_s / args.trials,
            "driver_cpu_s_per_trial_by_quarter": watch.cpu_per_trial_by_quarter(args.trials),
            # every trial actor's CPU, its start-up included, at its last sample (1 s apart)
            "actors_cpu_s_per_trial": sum(watch.actor_cpu_s.values()) / args.trials,
            "overhead_s": trial_overhead, "overhead_left_out": left_out,
            "overhead_p50_s_by_quarter": by_quarter(values, args.trials),
            "overhead_over_floor": {k: ratio(trial_overhead[k], floor["overhead_s"][k]) for k in ("p50", "p99")},
            "actor_rss_mib": percentiles([kib / 1024 for kib in watch.rss_kib]),
            "actors_rss_total_mib_max": watch.rss_total_kib / 1024,
            "actors_max": watch.actors_max, "postgres_connections_max": watch.connections_max,
            "nodes_out": sweep.nodes_out, "phases": [asdict(p) for p in phases], "events": watch.events,
        },
        "floor": floor,
        **extra,
    }


def by_quarter(values: dict[str, float], trials: int) -> list[float | None]:
    """Median overhead of the trials numbered in each quarter of the sweep (folders tNNN)."""
    quarters: list[list[float]] = [[], [], [], []]
    for trial, value in values.items():
        if trial[1:].isdigit():
            quarters[min(3, int(trial[1:]) * 4 // trials)].append(value)
    return [statistics.median(q) if q else None for q in quarters]


def render(report: dict[str, Any]) -> str:
    s, f = report["sweep"], report["floor"]
    o, fo, r = s["overhead_s"], f["overhead_s"], s["overhead_over_floor"]
    kill, resume = s["phases"][0], s["phases"][-1]
    mib = {k: v / 1024**2 for k, v in report["sizes_bytes"].items()}
    lines = [
        f"{report['machine_start']['date']}: {s['trials']} trials, {s['concurrency']} at a time, "
        f"{report['args']['nodes']} nodes x {report['args']['cpus_per_node']:g} CPUs",
        f"trials per hour           sweep {s['trials_per_hour']:.0f}, floor {f['trials_per_hour']:.0f}",
        f"driver CPU s per trial    sweep {s['driver_cpu_s_per_trial']:.3f}, floor {f['driver_cpu_s_per_trial']:.3f}; "
        f"sweep by quarter of trials finished: {_fs(s['driver_cpu_s_per_trial_by_quarter'])}",
        f"trial actors' CPU s/trial {s['actors_cpu_s_per_trial']:.2f} (their start-up included)",
        f"overhead per trial (s)    p50 {_f(o['p50'])} ({_f(r['p50'], 'x')} the floor's {_f(fo['p50'])}), "
        f"p99 {_f(o['p99'])} ({_f(r['p99'], 'x')} the floor's {_f(fo['p99'])}); "
        f"{o['n']} trials, {s['overhead_left_out']} on several actors left out; p50 by quarter "
        f"of trial numbers: {_fs(s['overhead_p50_s_by_quarter'])}",
        f"2 nodes out               {_f(s['nodes_out'].get('seconds'))} s, trials finished meanwhile: "
        f"{s['nodes_out'].get('finished_meanwhile', '-')}, failed node starts: "
        f"{s['nodes_out'].get('failed_starts', '-')}",
        f"trial actor RSS (MiB)     p50 {_f(s['actor_rss_mib']['p50'])}, p99 {_f(s['actor_rss_mib']['p99'])}; "
        f"all actors at most {s['actors_rss_total_mib_max']:.0f} MiB ({s['actors_max']} actors)",
        "TPE suggest (ms)          " + ", ".join(f"{n} finished: {_f(v)}" for n, v in report["suggest_ms"].items()),
        *(f"MLflow {k:<18s} p50 {_f(v['all_ms']['p50'])} ms, p99 {_f(v['all_ms']['p99'])} ms "
          f"(first fifth p50 {_f(v['first_fifth_ms']['p50'])}, last fifth {_f(v['last_fifth_ms']['p50'])})"
          for k, v in report["mlflow_probe"].items()),
        f"PostgreSQL connections    at most {s['postgres_connections_max']}",
        "sizes (MiB)               " + ", ".join(f"{k} {v:.1f}" for k, v in mib.items()),
        (f"kill and resume           killed at {kill['finished']} finished; resume: first step "
         f"{_f(resume['first_step_s'])} s, first new trial {_f(resume['first_asked_s'])} s, "
         f"done in {resume['wall_s']:.0f} s" if len(s["phases"]) > 1 else
         f"kill and resume           not killed (ended with {kill['finished']} finished in {kill['wall_s']:.0f} s)"),
        f"sweep restarted by itself {len(report['driver_restarts'])} time(s) after a fault of the cluster"
        + "".join(f"\n  {line}" for line in report["driver_restarts"]),
        f"load average              start {_load(report['machine_start'])}, end {_load(report['machine_end'])}",
        report["audit"],
        *(["the resumed driver's main thread (cProfile, wall time):", *report["driver_profile"]] if report.get("driver_profile") else []),
    ]
    return "\n".join(lines)


def _f(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def _fs(values: list[float | None]) -> str:
    return " ".join(_f(v) for v in values)


def _load(m: dict[str, Any]) -> str:
    return " ".join(f"{x:.1f}" for x in m["load_average"])


# --- the run -------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    start_machine = machine()
    warn_memory(args.concurrency)
    server = postgres.start_server(durable=True, max_connections=MAX_CONNECTIONS)
    cluster = None
    try:
        optuna_url, mlflow_url = server.create_database("optuna"), server.create_database("mlflow")
        cluster = start_cluster(args.nodes, args.cpus_per_node)
        floor = run_floor(cluster.address, args.trials, args.concurrency, args.cpus_per_trial, work / "floor")
        print(f"floor: {json.dumps(floor)}", flush=True)
        env = {**os.environ, "RAY_ADDRESS": cluster.address, "MLFLOW_TRACKING_URI": mlflow_url,
               "OPTUNA_URL": optuna_url}
        dbs = Databases(optuna_url, mlflow_url)
        sweep = Sweep(args, cluster, dbs, work, env)
        phases = drive_with_probe(sweep, args, work, mlflow_url)
        report = summarize(args, sweep, phases, floor, gather(args, work, dbs))
        dbs.close()
        report["machine_start"], report["machine_end"] = start_machine, machine()
        return report
    finally:
        if cluster is not None:
            cluster.shutdown()
        server.stop()


def drive_with_probe(sweep: Sweep, args: argparse.Namespace, work: Path, mlflow_url: str) -> list[Phase]:
    """The sweep until the kill, then its resume, with the MLflow probe running all along."""
    space_file = work / "scale.yaml"
    space_file.write_text(yaml.safe_dump(scale_space(args.trials, args.concurrency, args.steps,
                                                      args.retries, args.cpus_per_trial, args.workers),
                                          sort_keys=False))
    spawn = mp.get_context("spawn")
    stop = spawn.Event()
    probe = spawn.Process(target=probe_mlflow, args=(mlflow_url, f"sweep-{SWEEP}", str(work / PROBE), stop))
    probe.start()
    try:
        phases = [sweep.first(space_file)]
        if phases[0].returncode not in (0, -signal.SIGKILL):
            log = (work / "sweep-1.log").read_text().strip().splitlines()
            raise SystemExit(f"the sweep's driver failed ({phases[0].returncode}):\n" + "\n".join(log[-5:]))
        if phases[0].finished < args.trials:
            phases.append(sweep.resume())
    finally:
        stop.set()
        probe.join(60)
    return phases


def gather(args: argparse.Namespace, work: Path, dbs: Databases) -> dict[str, Any]:
    """After the sweep: sizes (before the suggest studies add to the Optuna database), the
    trials' segments, TPE's suggest latency, the probe's timings, the audit, the profile."""
    from urm_ray.tune.audit import audit_sweep
    from urm_ray.tune.sweep import load_sweep

    info = load_sweep(SWEEP, str(work / "sweeps"))[0]
    snapshots = sorted((info.path / "tune").glob("experiment_state-*.json"))
    sizes = {**dbs.sizes(), "mlflow_artifacts": folder_bytes(work / "mlruns"),
             "tune_state": folder_bytes(info.path / "tune"),
             "tune_experiment_state": snapshots[-1].stat().st_size if snapshots else 0,
             "drivers_output": sum(p.stat().st_size for p in work.glob("sweep-*.log"))}
    audit = audit_sweep(info, args.trials)
    restarts = [line for log in sorted(work.glob("sweep-*.log"))
                for line in log.read_text(errors="replace").splitlines() if RESTART_LINE in line]
    return {
        "segments": read_segments(info.path / "tune", ("time/train_s", "time/eval_s"),
                                  dbs.trial_ends(info.experiment)),
        "sizes_bytes": sizes,
        "suggest_ms": suggest_latency(work),
        "mlflow_probe": probe_summary(work / PROBE),
        "audit": audit.render(), "audit_ok": audit.ok, "audit_s": audit.seconds,
        "driver_restarts": restarts,
        "driver_profile": profile_top(work / PROFILE) if args.profile else [],
        "args": vars(args),
    }


RESTART_LINE = "Tune stopped on a fault of the cluster"  # what urm-ray sweep prints when it goes on

# where the driver's time goes: (file, function) of the profile -> what it does
PROFILED = {
    ("search.py", "suggest"): "SweepSearch.suggest (a new trial)",
    ("search.py", "__call__"): "  of which the space's define-by-run ask (TPE)",
    ("search.py", "_orphan"): "  of which looking for a trial to take over",
    ("search.py", "on_trial_result"): "SweepSearch.on_trial_result",
    ("search.py", "on_trial_complete"): "SweepSearch.on_trial_complete (Optuna tell)",
    ("fate.py", "on_trial_complete"): "FateRecorder.on_trial_complete (MLflow fate)",
    ("fate.py", "on_trial_error"): "FateRecorder.on_trial_error",
    ("table.py", "draw"): "TrialTable.draw",
    ("experiment_state.py", "sync_up_experiment_state"): "Tune's experiment snapshot",
    ("tune_controller.py", "step"): "Tune's loop, all of it",
}


def profile_top(path: Path) -> list[str]:
    """The resumed driver's time (wall, main thread: Tune's loop) in the calls it makes per trial."""
    import pstats

    if not path.exists():
        return []
    stats = pstats.Stats(str(path)).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    lines = []
    for (file, _, name), (_, calls, _, cumulative, _) in stats.items():
        what = PROFILED.get((Path(file).name, name))
        if what and (name != "step" or "tune" in file) and ("urm_ray" in file or "ray" in file):
            lines.append((what, calls, cumulative))
    order = list(PROFILED.values())
    return [f"  {what:<46s} {calls:6d} calls {total:8.1f} s {1000 * total / calls:8.1f} ms each"
            for what, calls, total in sorted(lines, key=lambda x: order.index(x[0]))]


def warn_memory(concurrency: int) -> None:
    """Say so when the trial actors may not fit in the memory available now."""
    available = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemAvailable")) / 1024  # MiB
    needed = (concurrency + 1) * ACTOR_MIB  # Tune keeps an idle actor or so for reuse
    if needed > available:
        print(f"warning: {concurrency} trial actors may need about {needed:,.0f} MiB; "
              f"{available:,.0f} MiB are available now", flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--nodes", type=int, default=8, help="Ray nodes, the head included")
    parser.add_argument("--cpus-per-node", type=float, default=5.0, help="logical CPUs of each node")
    parser.add_argument("--cpus-per-trial", type=float, default=1.0, help="logical CPUs of a trial, its workers' together")
    parser.add_argument("--workers", type=int, default=1,
                        help="workers per trial (1: it trains in its Tune actor; more: in Ray Train's worker actors)")
    parser.add_argument("--steps", type=int, default=20, help="training steps of a trial ASHA keeps")
    parser.add_argument("--retries", type=int, default=1)
    parser.add_argument("--kill-at", type=int, default=None,
                        help="SIGKILL the sweep's driver at this many finished trials, then resume "
                             "(default: half the trials; 0: never)")
    parser.add_argument("--remove-at", type=int, default=None,
                        help="remove 2 worker nodes at this many finished trials (default: a quarter; 0: never)")
    parser.add_argument("--add-after", type=float, default=60.0,
                        help="add 2 nodes back this many seconds after the removal (default 60)")
    parser.add_argument("--profile", action="store_true",
                        help="run the resumed driver under cProfile; print its costliest functions")
    parser.add_argument("--dir", default="", help="work folder (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--json", default="", help="also write the report to this file")
    args = parser.parse_args(argv)
    args.kill_at = args.trials // 2 if args.kill_at is None else args.kill_at
    args.remove_at = args.trials // 4 if args.remove_at is None else args.remove_at
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: a trial needs at least 1 worker")
    if args.remove_at and args.nodes < 3:
        parser.error("removing 2 worker nodes needs --nodes 3 or more")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # this process, the probe, the sweep
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # the floor's Tuner: no banner (as the sweep's)
    work = Path(args.dir or tempfile.mkdtemp(prefix="urm-ray-scale-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder {work}; {machine()}", flush=True)
    try:
        report = run(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    print(render(report))
    return report


if __name__ == "__main__":
    main()
