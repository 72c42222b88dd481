"""Many processes logging metrics into one MLflow store at once: SQLite against PostgreSQL.

    python bench/tracking_concurrency.py                               # 16 writers, 3 rounds
    python bench/tracking_concurrency.py --writers 32 --steps 100 --rounds 3 --json out.json
    python bench/tracking_concurrency.py --modes server               # through mlflow server only

What a sweep does to its tracking store, without the training: ``--writers`` processes each open a
run, wait for the others, then log ``--keys`` metrics per step in one batch (``log_batch``, as
urm_ray's tracker does) for ``--steps`` steps, all at once. Afterwards every run's metric history
is read back and compared with what was sent.

Two backends, each reached two ways (``--modes``):
  server   through ``mlflow server`` (http://), the cluster's setup: one server backed by an SQLite
           file, one by PostgreSQL, both started here (``--server-workers`` uvicorn workers, 4 as
           mlflow's default) and stopped at the end;
  direct   each writer opens the store itself (``sqlite:///...``, ``postgresql://...``).
PostgreSQL is a throwaway server started here (tests/postgres.py) with fsync on, as SQLite has.

Per backend and mode: calls that failed (after the MLflow client's own retries), calls the client
retried (HTTP 5xx/429 from the server), points lost (sent, not read back) and duplicated, the
latency of a ``log_batch`` call (p50/p99 over every call of every round) and the points per
second while all writers log (median over rounds). Each round runs every backend and mode once,
the order turned around every other round, so a slow spell of this machine lands on both.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
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
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
# the tests' throwaway PostgreSQL server (tests/ is no package: loaded from its file)
_SPEC = importlib.util.spec_from_file_location("urm_ray_tests_postgres", ROOT / "tests" / "postgres.py")
postgres = sys.modules[_SPEC.name] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(postgres)

BACKENDS = ("sqlite", "postgresql")
MODES = ("server", "direct")
SERVER_START_S = 120.0


@dataclass
class Writer:
    """What one writer process saw."""

    run_id: str = ""
    latencies_ms: list[float] = field(default_factory=list)  # one per log_batch call that returned
    errors: list[str] = field(default_factory=list)  # calls that raised (after the client's retries)
    retries: int = 0  # HTTP retries the client made (urllib3's "Retrying" warnings)
    sent: int = 0  # metric points in calls that returned
    start: float = 0.0  # wall-clock span of its logging loop
    end: float = 0.0


@dataclass
class Round:
    backend: str
    mode: str
    writers: int
    calls: int
    errors: int
    retries: int
    sent: int  # points in calls that returned
    attempted: int  # points in every call, failed or not
    read_back: int  # distinct (run, key, step) found
    duplicates: int  # values beyond one per (run, key, step)
    points_per_s: float
    latencies_ms: list[float]
    first_errors: list[str]

    @property
    def lost(self) -> int:
        return self.sent - self.read_back  # a failed call's points are counted as errors, not lost


class _RetryCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Retrying"):
            self.count += 1


def write(uri: str, experiment_id: str, steps: int, keys: int, barrier: Any, out: Any) -> None:
    """One writer: open a run, wait for every writer, log ``keys`` metrics at each of ``steps``."""
    seen = Writer()
    counter = _RetryCounter()
    logging.getLogger("urllib3.connectionpool").addHandler(counter)
    logging.getLogger("mlflow").setLevel(logging.CRITICAL)  # each failure is counted and kept, once
    client = MlflowClient(uri)
    try:
        seen.run_id = client.create_run(experiment_id).info.run_id
    except Exception as err:  # noqa: BLE001 - counted, not raised: the parent reports it
        seen.errors.append(f"create_run: {err!r}"[:300])
    barrier.wait(timeout=600)
    seen.start = time.time()
    for step in range(steps if seen.run_id else 0):
        now = int(time.time() * 1000)
        batch = [Metric(f"m{k}", float(step * keys + k), now, step) for k in range(keys)]
        begin = time.perf_counter()
        try:
            client.log_batch(seen.run_id, metrics=batch)
        except Exception as err:  # noqa: BLE001
            seen.errors.append(f"step {step}: {err!r}"[:300])
            continue
        seen.latencies_ms.append((time.perf_counter() - begin) * 1000)
        seen.sent += keys
    seen.end = time.time()
    seen.retries = counter.count
    out.put(asdict(seen))


def run_round(ctx: Any, backend: str, mode: str, uri: str, args: argparse.Namespace, k: int) -> Round:
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(f"{backend}-{mode}-{k:02d}-{time.time_ns()}")
    barrier, out = ctx.Barrier(args.writers), ctx.Queue()
    procs = [ctx.Process(target=write, args=(uri, experiment_id, args.steps, args.keys, barrier, out))
             for _ in range(args.writers)]
    for proc in procs:
        proc.start()
    seen = [Writer(**out.get(timeout=3600)) for _ in procs]
    for proc in procs:
        proc.join()
    read_back, duplicates = _read_back(client, [w.run_id for w in seen if w.run_id], args.keys)
    span = max(w.end for w in seen) - min(w.start for w in seen)
    sent = sum(w.sent for w in seen)
    errors = [e for w in seen for e in w.errors]
    return Round(backend, mode, args.writers, args.writers * args.steps, len(errors),
                 sum(w.retries for w in seen), sent, args.writers * args.steps * args.keys,
                 read_back, duplicates, sent / span if span > 0 else 0.0,
                 [x for w in seen for x in w.latencies_ms], errors[:3])


def _read_back(client: MlflowClient, run_ids: list[str], keys: int) -> tuple[int, int]:
    found, values = 0, 0
    for run_id in run_ids:
        for k in range(keys):
            history = client.get_metric_history(run_id, f"m{k}")
            found += len({m.step for m in history})
            values += len(history)
    return found, values - found


def start_mlflow_server(backend_uri: str, folder: Path, workers: int) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` on a free port in its own process group; returns it and its URL."""
    port = postgres.free_port()
    log = open(folder / f"mlflow-{port}.log", "wb")  # noqa: SIM115 - the server holds it
    cmd = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
           "--port", str(port), "--workers", str(workers), "--backend-store-uri", backend_uri,
           "--artifacts-destination", str(folder / f"artifacts-{port}")]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # not used here; faster start
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True)  # its workers share the group: killed together
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return server, url
        except OSError:
            time.sleep(0.5)
    stop_group(server)
    text = (folder / f"mlflow-{port}.log").read_text(errors="replace")[-3000:]
    raise RuntimeError(f"mlflow server on {backend_uri} did not answer {url}/health:\n{text}")


def stop_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=10)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def summarise(rounds: list[Round]) -> list[dict[str, Any]]:
    rows = []
    for backend in BACKENDS:
        for mode in MODES:
            mine = [r for r in rounds if (r.backend, r.mode) == (backend, mode)]
            if not mine:
                continue
            latencies = sorted(x for r in mine for x in r.latencies_ms)
            rows.append({
                "backend": backend, "mode": mode, "rounds": len(mine), "writers": mine[0].writers,
                "calls": sum(r.calls for r in mine), "errors": sum(r.errors for r in mine),
                "retried": sum(r.retries for r in mine), "sent": sum(r.sent for r in mine),
                "attempted": sum(r.attempted for r in mine), "lost": sum(r.lost for r in mine),
                "duplicates": sum(r.duplicates for r in mine),
                "p50_ms": _percentile(latencies, 50), "p99_ms": _percentile(latencies, 99),
                "points_per_s": statistics.median(r.points_per_s for r in mine),
                "points_per_s_rounds": [round(r.points_per_s) for r in mine],
                "first_errors": [e for r in mine for e in r.first_errors][:3],
            })
    return rows


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'backend':<11}{'mode':<8}{'calls':>7}{'errors':>8}{'retried':>9}{'lost':>7}"
            f"{'dup':>6}{'p50 ms':>9}{'p99 ms':>9}{'points/s':>10}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['backend']:<11}{r['mode']:<8}{r['calls']:>7}{r['errors']:>8}{r['retried']:>9}"
                     f"{r['lost']:>7}{r['duplicates']:>6}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
                     f"{r['points_per_s']:>10.0f}")
    return "\n".join(lines)


def stores(modes: list[str], folder: Path, pg: Any, servers: list[subprocess.Popen],
           workers: int) -> dict[tuple[str, str], str]:
    """The tracking URI of each (backend, mode): servers started, database stores created."""
    databases = {"sqlite": lambda name: f"sqlite:///{folder / name}.db",
                 "postgresql": lambda name: pg.create_database(name)}
    uris = {}
    for backend in BACKENDS:
        for mode in modes:
            backend_uri = databases[backend](f"mlflow_{mode}")
            started = time.perf_counter()
            if mode == "server":
                server, backend_uri = start_mlflow_server(backend_uri, folder, workers)
                servers.append(server)
            MlflowClient(backend_uri).search_experiments(max_results=1)  # tables created once, here
            print(f"{backend} {mode}: {backend_uri} ready in {time.perf_counter() - started:.0f} s",
                  flush=True)
            uris[(backend, mode)] = backend_uri
    return uris


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parser().parse_args(argv)
    # MLflow's telemetry thread, failing to reach its endpoint, removes a variable from os.environ
    # while a request may be reading it (KeyError '_MLFLOW_TELEMETRY_SESSION_ID' from log_batch, 2
    # calls in 9,600 here): a client fault, whatever the store. Off for the writers and servers.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    ctx = mp.get_context("forkserver")
    # writers fork from a process that imported this module (and mlflow) once and opened nothing
    ctx.set_forkserver_preload(["__main__" if __name__ == "__main__" else __name__])
    began, load = time.monotonic(), os.getloadavg()[:1]  # this machine is shared: say how busy
    date = time.strftime("%Y-%m-%d %H:%M %Z")
    rounds: list[Round] = []
    servers: list[subprocess.Popen] = []
    pg = postgres.start_server(durable=True, max_connections=max(100, 4 * args.writers))
    folder = Path(tempfile.mkdtemp(prefix="urm-ray-tracking-bench-"))
    try:
        uris = stores(args.modes, folder, pg, servers, args.server_workers)
        order = [(b, m) for m in args.modes for b in BACKENDS]
        for k in range(args.rounds):
            for backend, mode in order if k % 2 == 0 else order[::-1]:
                done = run_round(ctx, backend, mode, uris[(backend, mode)], args, k)
                print(f"round {k + 1}/{args.rounds} {backend:<10} {mode:<6}: {done.errors} errors, "
                      f"{done.lost} lost, {done.points_per_s:.0f} points/s", flush=True)
                rounds.append(done)
    finally:
        for server in servers:
            stop_group(server)
        pg.stop()
        shutil.rmtree(folder, ignore_errors=True)
    rows = summarise(rounds)
    result = {"date": date, "machine": _machine(), "args": vars(args),
              "load_before_after": [round(x, 1) for x in (*load, os.getloadavg()[0])],
              "seconds": round(time.monotonic() - began),
              "command": " ".join(["python", "bench/tracking_concurrency.py", *(argv or sys.argv[1:])]),
              "rows": rows}
    print(f"started {result['date']}, {result['machine']}, load average {result['load_before_after'][0]} "
          f"before, {result['load_before_after'][1]} after, {result['seconds']} s")
    print(table(rows))
    for row in rows:
        for err in row["first_errors"]:
            print(f"  {row['backend']} {row['mode']}: {err}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


def _machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()}-core {platform.machine()}, {memory:.0f} GiB, {socket.gethostname()}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=16, help="processes logging at once")
    parser.add_argument("--steps", type=int, default=100, help="log_batch calls per writer")
    parser.add_argument("--keys", type=int, default=5, help="metrics per call")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--server-workers", type=int, default=4,
                        help="mlflow server --workers (default 4, as mlflow server's own)")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    return parser


if __name__ == "__main__":
    main()
