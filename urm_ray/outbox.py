"""Writes to a store that may be away for a while: kept in order, written by a thread, retried.

The training loop's MLflow records go through one (``tracking.MlflowTracker``), so that a
restarted tracking server or a long database lock slows nothing and fails nothing while training
runs: a write the store refuses for a transient reason is tried again with backoff, and the
writes after it wait in memory, in order, until it is back.

    box = Outbox(write, transient, "MLflow tracking store http://mlflow.lan:5000")
    box.put(item)              # while the store answers: returns once the item is written
    unwritten = box.close(600) # waits up to 600 s for the rest; returns what is still unwritten

``write(items)`` writes the first of ``items`` (one or more at once) and returns how many it
wrote. After a transient failure the same items are written again, so a write must be safe to
repeat. An error ``transient`` rejects ends the writing: ``put`` and ``close`` raise it.
``retried(call, ...)`` is the same retry for one call made where the caller can wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from urm_ray import redact

logger = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_RETRY_S = 1.0  # the first retry of a failed write; each further one waits twice as long,
MAX_RETRY_S = 5.0    # up to this: a store that is back is written to again within it
# what ``put`` waits for its write while the store answers; a write held up longer (a locked
# SQLite database waits for its lock) goes on behind training
WAIT_S = 5.0


def one_line(err: BaseException) -> str:
    """An error as one short line for a log message (no password of a URL)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else type(err).__name__
    return redact.redact(text if len(text) <= 300 else text[:300] + "...")


class Outbox:
    """Items for a store, written in order by a daemon thread started at the first ``put``."""

    def __init__(self, write: Callable[[list[Any]], int], transient: Callable[[BaseException], bool],
                 store: str, wait_s: float = WAIT_S) -> None:
        self._write, self._transient, self.store, self.wait_s = write, transient, store, wait_s
        self._items: list[Any] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._given_up = threading.Event()  # close stopped waiting: no more tries
        self._failed: BaseException | None = None  # a write no retry can mend
        self._behind = False  # a write outlasted ``wait_s``: puts go on without waiting until caught up
        self.away_since: float | None = None  # monotonic time of the current outage's first failure
        self.last_error: BaseException | None = None

    def put(self, item: Any, wait: bool = True) -> None:
        """Queue ``item``; while the store answers, wait (up to ``wait_s``) until it is written
        (``wait`` False: return at once)."""
        with self._cond:
            self._raise_failed()
            assert not self._closing, "put after close"
            self._items.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="urm_ray-outbox", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            if not wait or self._behind or self.away_since is not None:
                return
            written = self._cond.wait_for(
                lambda: not self._items or self.away_since is not None or self._failed is not None,
                self.wait_s)
            self._behind = not written
            self._raise_failed()

    def close(self, limit_s: float) -> list[Any]:
        """Wait up to ``limit_s`` seconds for every item to be written; returns those that were
        not (empty: all written). Raises the error that ended the writing, if one did."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            if self._items and self.away_since is not None:
                logger.warning("%s still unreachable: waiting up to %.0f min to write the %d records "
                               "kept meanwhile", self.store, limit_s / 60, len(self._items))
            self._cond.wait_for(lambda: not self._items or self._failed is not None, limit_s)
            self._given_up.set()
            self._raise_failed()
            return list(self._items)

    def _raise_failed(self) -> None:
        if self._failed is not None:
            raise self._failed

    def _run(self) -> None:
        delay = FIRST_RETRY_S
        while not self._given_up.is_set():
            with self._cond:
                self._cond.wait_for(lambda: self._items or self._closing)
                if not self._items:
                    return
                pending = list(self._items)  # written outside the lock: puts go on meanwhile
            try:
                written = self._write(pending)
            except Exception as err:  # noqa: BLE001 (tried again, or raised by put and close)
                if not self._transient(err):
                    with self._cond:
                        self._failed = err
                        self._cond.notify_all()
                    return
                self._note_away(err)
                self._given_up.wait(delay)
                delay = min(2 * delay, MAX_RETRY_S)
                continue
            delay = FIRST_RETRY_S
            with self._cond:
                self._note_back(len(self._items))
                del self._items[:written]
                self._behind = self._behind and bool(self._items)
                self._cond.notify_all()

    def _note_away(self, err: BaseException) -> None:
        with self._cond:
            self.last_error = err
            if self.away_since is None:
                self.away_since = time.monotonic()
                logger.warning("%s unreachable (%s); training goes on, and what it records waits in "
                               "memory, in order, until the store is back", self.store, one_line(err))
            self._cond.notify_all()

    def _note_back(self, kept: int) -> None:
        if self.away_since is not None:
            logger.warning("%s is back after %.0f s; writing the %d records kept meanwhile",
                           self.store, time.monotonic() - self.away_since, kept)
            self.away_since = None


def retried(call: Callable[[], T], transient: Callable[[BaseException], bool], what: str,
            limit_s: float) -> T:
    """``call()``, tried again with backoff while it fails for a ``transient`` reason, for up to
    ``limit_s`` seconds; then its last error is raised. Warns at the first failure."""
    deadline = time.monotonic() + limit_s
    delay = FIRST_RETRY_S
    while True:
        try:
            return call()
        except Exception as err:
            if not transient(err) or time.monotonic() + delay > deadline:
                raise
            if delay == FIRST_RETRY_S:
                logger.warning("%s failed (%s); trying again for up to %.0f min", what, one_line(err),
                               limit_s / 60)
            time.sleep(delay)
            delay = min(2 * delay, MAX_RETRY_S)
