"""A run whose driver dies cannot stay RUNNING: the heartbeat, its loss after a real SIGKILL,
and what `urm-ray runs` and a resume say about it."""

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from urm_ray import heartbeat, tracking
from urm_ray.runs import list_runs
from urm_ray.tracking import HEARTBEAT_TAG

DRIVER = textwrap.dedent("""
    import sys, time
    from urm_ray import heartbeat, tracking
    uri = sys.argv[1]
    run_id = tracking.open_run(uri, "hb", "doomed", {})
    with heartbeat.beating(tracking.Run(uri, run_id), every_s=0.2):
        print(run_id, flush=True)
        time.sleep(600)   # "training", until SIGKILL
""")


def test_beating_writes_the_time_until_the_block_ends(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.open_run(uri, "hb", "alive", {})
    before = time.time()
    with heartbeat.beating(tracking.Run(uri, run_id), every_s=0.05):
        first = float(tracking.Run(uri, run_id).summary().tags[HEARTBEAT_TAG])
        time.sleep(1.5)
    last = float(tracking.Run(uri, run_id).summary().tags[HEARTBEAT_TAG])  # a beat may land up to the exit
    assert before - 1 <= first < last  # beats at once, then again
    time.sleep(0.3)
    assert float(tracking.Run(uri, run_id).summary().tags[HEARTBEAT_TAG]) == last  # none after the block
    with heartbeat.beating(tracking.NullRun()):  # tracking off: nothing to beat on
        pass


def test_a_killed_driver_shows_as_lost_and_its_resume_says_so(tmp_path: Path, caplog):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.open_run(uri, "hb", "placeholder", {})  # the store exists before the driver starts
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, uri], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    run_id = driver.stdout.readline().strip()
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(timeout=30)
    run = tracking.Run(uri, run_id).summary()
    assert run.status == "RUNNING" and HEARTBEAT_TAG in run.tags  # what MLflow alone would show

    doomed = [line for line in list_runs(uri, "hb").splitlines() if " doomed " in line]
    assert "RUNNING" in doomed[0] and "driver lost" not in doomed[0]  # beat moments ago
    later = time.time() + heartbeat.STALE_S + 1
    doomed = [line for line in list_runs(uri, "hb", now=later).splitlines() if " doomed " in line]
    assert "FAILED (driver lost)" in doomed[0]
    placeholder = [line for line in list_runs(uri, "hb", now=later).splitlines() if "placeholder" in line]
    assert "RUNNING" in placeholder[0] and "lost" not in placeholder[0]  # never beat: not judged

    tracking.Run(uri, run_id).set_tags({HEARTBEAT_TAG: f"{time.time() - heartbeat.STALE_S - 60:.0f}"})
    with caplog.at_level(logging.WARNING, logger="urm_ray.heartbeat"):
        heartbeat.warn_if_lost(tracking.find_summary(uri, "hb", "doomed"))
    assert "doomed was left RUNNING by a driver that stopped beating 6 min ago (driver lost)" in caplog.text
    tracking.Run(uri, run_id).close("FINISHED")
    assert not heartbeat.lost("FINISHED", tracking.Run(uri, run_id).summary().tags)
