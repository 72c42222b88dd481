"""A driver's heartbeat on its MLflow run, so a run whose driver died cannot stay RUNNING.

While a run trains (or a sweep runs), a daemon thread of the process that opened it writes the
time into the run's ``urm_ray.heartbeat`` tag every ``BEAT_S`` seconds. A run still RUNNING
whose last beat is older than ``STALE_S`` lost its driver (SIGKILL, a dead node, a closed laptop):
``urm-ray runs`` shows it as failed ("driver lost"), and a resume says so before it reopens it.
A beat the store misses (a tracking server restarting) is warned about, once per outage, and
never stops the run.
The W&B "crashed" state works the same way.

    with beating(run):                  # a tracking.Run (a NullRun: no beats)
        trainer.fit()
    lost(run.status, run.tags)      # True: RUNNING, last beat over STALE_S ago
    check_reopen(previous, in_sweep=False)  # ConfigError: another driver beats on it now

One driver per run: a RUNNING run whose heartbeat is fresh has a live driver elsewhere, unless
the driver it records (``urm_ray.driver``: host:pid, ``this_driver``) ran on this host and its
process is gone. A stale heartbeat is a lost driver: the run resumes.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from urm_ray import tracking
from urm_ray.errors import ConfigError
from urm_ray.outbox import one_line
from urm_ray.tracking import DRIVER_TAG, HEARTBEAT_TAG

logger = logging.getLogger(__name__)

BEAT_S = 30.0
# several missed beats: a loaded machine or a slow MLflow server delays one, not ten
STALE_S = 300.0


def _beat(run: tracking.Run, missing: bool = False) -> bool:
    """One beat; returns whether it was missed. ``missing``: the previous one was. A run of missed
    beats is warned about at its first and when beats are written again."""
    run_id = run.id
    try:
        run.set_tags({HEARTBEAT_TAG: f"{time.time():.0f}"})
    except Exception as err:  # a missed beat must never stop training
        if not missing:
            logger.warning("heartbeat of MLflow run %s not written (%s); training goes on. Should "
                           "none be written for %.0f min, `urm-ray runs` shows the run as driver "
                           "lost meanwhile", run_id, one_line(err), STALE_S / 60)
        return True
    if missing:
        logger.warning("heartbeat of MLflow run %s written again", run_id)
    return False


@contextmanager
def beating(run: tracking.Run | tracking.NullRun, every_s: float = BEAT_S) -> Iterator[None]:
    """Beats on ``run`` now and every ``every_s`` seconds until the block ends (nothing for a
    ``NullRun``: tracking is off)."""
    if not run:
        yield
        return
    missing = _beat(run)
    stop = threading.Event()

    def loop() -> None:
        nonlocal missing
        while not stop.wait(every_s):
            missing = _beat(run, missing)

    thread = threading.Thread(target=loop, name=f"heartbeat-{run.id[:8]}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def last_beat_age(tags: dict[str, str], now: float | None = None) -> float | None:
    """Seconds since the run's last beat; None for a run that never beat (made before beats)."""
    if HEARTBEAT_TAG not in tags:
        return None
    return (time.time() if now is None else now) - float(tags[HEARTBEAT_TAG])


def lost(status: str, tags: dict[str, str], now: float | None = None) -> bool:
    """The run says RUNNING, but its driver stopped beating over ``STALE_S`` seconds ago."""
    age = last_beat_age(tags, now)
    return status == "RUNNING" and age is not None and age > STALE_S


def this_driver() -> str:
    """This process as a run records its driver (``urm_ray.driver``): host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def check_reopen(run: tracking.RunSummary | None, in_sweep: bool) -> None:
    """Before a driver reopens ``run`` (None: there is none, a new run starts): ConfigError while
    it says RUNNING with a fresh heartbeat from a driver not known to be gone (not in a sweep,
    where Tune runs one attempt of a trial at a time and restores a failed one at once); a warning
    when its last driver was lost."""
    if run is None:
        return
    age = last_beat_age(run.tags) if run.status == "RUNNING" else None
    if not in_sweep and age is not None and age <= STALE_S:
        driver = run.tags.get(DRIVER_TAG, "")
        if not gone(driver):
            raise ConfigError(busy(run.run_name, driver, age))
        logger.warning("MLflow run %s says RUNNING, beating %.0f s ago, but its driver (%s) is gone "
                       "from this host; resuming it", run.run_name, age, driver)
    warn_if_lost(run)


def gone(driver: str) -> bool:
    """Whether ``host:pid`` names a process of this host that no longer runs (or this one: a
    run this process left RUNNING)."""
    host, _, pid = driver.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another host's process cannot be seen from here
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def busy(run_name: str, driver: str, age: float | None = None, held: str = "") -> str:
    """Why a run is refused while ``driver`` trains it (``held``: what it holds, e.g. its lock)."""
    host, _, pid = driver.rpartition(":")
    where = f"on {host}, pid {pid}" if host and pid else "by another process"
    beat = "" if age is None else f", its heartbeat {age:.0f} s old"
    return (f"train.run_name={run_name} is training now {where}{held}{beat}: one driver "
            f"trains a run at a time. Wait for it to end, or start another train.run_name; a driver "
            f"that died without closing its MLflow run stops counting once its heartbeat is "
            f"{STALE_S:.0f} s old")


def warn_if_lost(run: tracking.RunSummary | None) -> None:
    """Before a resume reopens ``run`` (None: there is no run to reopen): says so when its last
    driver was lost."""
    if run is None:
        return
    if lost(run.status, run.tags):
        minutes = (last_beat_age(run.tags) or 0.0) / 60
        logger.warning("MLflow run %s was left RUNNING by a driver that stopped beating %.0f min"
                       " ago (driver lost); resuming it", run.run_name, minutes)
