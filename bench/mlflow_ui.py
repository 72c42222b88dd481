"""What a person sees of a large sweep in the MLflow UI: the experiment page, opened in a real
headless browser, timed, with a screenshot.

    python bench/mlflow_ui.py --populate 1000 --shot ui.png          # a fresh SQLite store shaped like a sweep
    python bench/mlflow_ui.py --tracking-uri postgresql://... --experiment sweep-s1 --shot ui.png

With ``--populate N`` it first writes, into a new SQLite store in a temporary folder (or the
store ``--tracking-uri`` names), one sweep the way ``urm-ray sweep`` records it: a parent run
and N nested trial runs, each with the sweep's tags (parent, kind, sweep, trial, fate), a
sampled config of 20 params, and 8 metrics logged at 3 steps. Then it starts ``mlflow server``
on the store, opens the experiment's page in Chromium (Playwright, headless; ``--browser`` names
the executable, default /usr/bin/chromium) and reports, over ``--rounds`` fresh page loads:

- ``table_s``: from navigation until the runs table says how many runs match (the trials come
  collapsed under the sweep's parent run);
- ``expand_s``: from a click on the parent run's expand control until its trials show;
- what the table says, the trial rows then shown, and the page's console errors.

Needs ``pip install playwright`` (no browser download: it drives the system's Chromium).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from urm_ray.tracking import (EXPERIMENT_KIND_TAG, FATE_TAG, KIND_TAG, MODEL_TRAINING, PARENT_TAG, SWEEP_TAG,
                              TRIAL_TAG)

FATES = ("completed", "pruned", "pruned", "completed", "failed")  # about a sweep's mix under ASHA
TIMEOUT_MS = 180_000
METRICS = ("train/loss", "train/accuracy", "eval/exact_accuracy", "eval/token_accuracy", "eval/loss",
           "time/train_s", "time/eval_s", "train/samples_per_s")


def populate(uri: str, experiment: str, trials: int, seed: int = 0) -> str:
    """One sweep's runs in ``experiment`` of ``uri``; returns the experiment id."""
    rng = random.Random(seed)
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(experiment, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
    parent = client.create_run(experiment_id, run_name=experiment, tags={KIND_TAG: "sweep", SWEEP_TAG: experiment})
    now = int(time.time() * 1000)
    for trial in range(trials):
        run = client.create_run(experiment_id, run_name=f"{experiment}-t{trial:03d}", tags={
            PARENT_TAG: parent.info.run_id, KIND_TAG: "trial", SWEEP_TAG: experiment, TRIAL_TAG: str(trial),
            FATE_TAG: FATES[trial % len(FATES)]})
        params = [Param(f"model.p{i}", str(rng.random())) for i in range(17)]
        params += [Param("model.loops", str(rng.randint(2, 8))), Param("model.truncation", str(rng.randint(0, 2))),
                   Param("optim.lr", f"{10 ** rng.uniform(-4, -2.5):.3g}")]
        metrics = [Metric(key, rng.random(), now + step, step) for key in METRICS for step in (10, 20, 30)]
        client.log_batch(run.info.run_id, metrics=metrics, params=params)
        client.set_terminated(run.info.run_id)
        if trial % 100 == 99:
            print(f"populated {trial + 1}/{trials} runs", flush=True)
    client.set_terminated(parent.info.run_id)
    return experiment_id


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve(uri: str, artifacts: Path) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` on ``uri``; returns the process and its URL once it answers."""
    import urllib.request

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
                               "--default-artifact-root", str(artifacts), "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            return server, url
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError(f"mlflow server on {uri} did not answer within 120 s")


def open_page(url: str, experiment: str, browser_path: str, rounds: int, shot: Path | None) -> dict[str, Any]:
    """Fresh loads of the experiment's runs page in headless Chromium: until the table counts its
    runs (the trials come collapsed under the sweep's parent run), then from a click on the
    parent's expand control until its first trial shows; what the table says, the trial rows
    then shown, the console's errors."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit("bench/mlflow_ui.py needs Playwright: pip install playwright") from None

    timings: dict[str, list[float]] = {"table_s": [], "expand_s": []}
    errors, rows, counted = [], 0, ""
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=browser_path, headless=True,
                                         args=["--no-sandbox", "--disable-gpu"])
        for attempt in range(rounds):
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            start = time.perf_counter()
            page.goto(url, wait_until="commit")
            count = page.get_by_text(re.compile(r"[1-9][0-9,]* matching runs")).first
            count.wait_for(timeout=TIMEOUT_MS)
            timings["table_s"].append(time.perf_counter() - start)
            counted = count.inner_text()
            start = time.perf_counter()
            page.get_by_role("row").filter(has_text=experiment).first.get_by_role("button").first.click()
            trial_rows = page.get_by_text(f"{experiment}-t", exact=False)
            trial_rows.first.wait_for(timeout=TIMEOUT_MS)
            timings["expand_s"].append(time.perf_counter() - start)
            rows = trial_rows.count()
            if shot is not None and attempt == rounds - 1:
                page.screenshot(path=str(shot), full_page=False)
            page.close()
        browser.close()
    return {**{key: statistics.median(values) for key, values in timings.items()},
            "rounds": rounds, "table_says": counted, "trial_rows_shown": rows,
            "console_errors": sorted(set(errors))[:10]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracking-uri", default="", help="the store (default: a new SQLite file)")
    parser.add_argument("--experiment", default="sweep-ui-bench")
    parser.add_argument("--populate", type=int, default=0, help="first write a sweep of this many trials")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--browser", default="/usr/bin/chromium")
    parser.add_argument("--shot", default="", help="save the last load's screenshot here (PNG)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="urm-ray-ui-") as folder:
        uri = args.tracking_uri or f"sqlite:///{folder}/mlflow.db"
        start = time.perf_counter()
        if args.populate:
            experiment_id = populate(uri, args.experiment, args.populate)
        else:
            found = MlflowClient(uri).get_experiment_by_name(args.experiment)
            if found is None:
                raise SystemExit(f"--experiment {args.experiment!r}: no such experiment in {uri} "
                                 "(--populate N writes one)")
            experiment_id = found.experiment_id
        populated_s = time.perf_counter() - start
        runs = len(MlflowClient(uri).search_runs([experiment_id], max_results=50_000))
        server, url = serve(uri, Path(folder) / "artifacts")
        try:
            report = open_page(f"{url}/#/experiments/{experiment_id}/runs", args.experiment, args.browser, args.rounds,
                               Path(args.shot) if args.shot else None)
        finally:
            server.terminate()
            server.wait()
    report = {"experiment": args.experiment, "runs": runs,
              "populate_s": round(populated_s, 1) if args.populate else None, **report}
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
