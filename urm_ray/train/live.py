"""A run's progress, sent by rank 0 and shown by the driver while Ray Train runs the loop.

    with watching(progress) as inbox:             # driver: shows what arrives, twice a second
        build_trainer(..., inbox=inbox).fit()
    sender = Sender(inbox if rank == 0 else None)  # worker: phase, start, step, report
    sender = Sender(Direct(progress))              # a loop in the driver's own process

Why a small actor that rank 0 writes to: in Ray Train 2.x the loop runs in worker actors while
the driver blocks in ``fit()``. A ``ray.train.UserCallback`` runs in the Train controller (another
actor) and sees only ``ray.train.report`` calls, every ``train.log_every`` steps: it would still
need a channel to the driver, and could show neither the workers' setup (building the model,
restoring a checkpoint) nor steps between reports. Polling MLflow needs tracking on and shows
reports only. The sends are fire-and-forget, so training never waits for the display, and the
actor (owned by the driver, 0 CPUs) outlives a worker group that Ray Train restarts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import ray

from urm_ray.progress import Progress

logger = logging.getLogger(__name__)

POLL_S = 0.5  # the driver fetches events this often
STEP_EVERY_S = 0.5  # rank 0 sends its step at most this often between reports


@dataclass(frozen=True)
class Event:
    kind: Literal["phase", "start", "step", "report"]
    step: int = 0
    text: str = ""  # phase
    metrics: dict[str, Any] = field(default_factory=dict)  # report: what rank 0 reported


@ray.remote(num_cpus=0)
class Inbox:
    """Events in arrival order, until the driver takes them."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def put(self, event: Event) -> None:
        self.events.append(event)

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events


class Remote:
    """The ``Inbox`` actor as rank 0 sees it: each send is fire-and-forget."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def put(self, event: Event) -> None:
        self.actor.put.remote(event)  # not awaited: the loop goes on at once


class Direct:
    """The inbox of a loop in the driver's own process (``resources.in_process``): shows each event
    as it is sent, with no actor between."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def put(self, event: Event) -> None:
        show(self.progress, event)


class Sender:
    """A worker's side; ``inbox`` (``Remote`` or ``Direct``) None (ranks other than 0, runs
    nobody watches): does nothing."""

    def __init__(self, inbox: Any = None, every_s: float = STEP_EVERY_S) -> None:
        self.inbox, self.every_s = inbox, every_s
        self._last_step = float("-inf")

    def phase(self, text: str) -> None:
        self._put(Event("phase", text=text))

    def start(self, step: int) -> None:
        self._put(Event("start", step))

    def step(self, step: int) -> None:
        now = time.monotonic()
        if now - self._last_step >= self.every_s:
            self._last_step = now
            self._put(Event("step", step))

    def report(self, step: int, metrics: dict[str, Any]) -> None:
        self._put(Event("report", step, metrics=metrics))

    def _put(self, event: Event) -> None:
        if self.inbox is not None:
            self.inbox.put(event)


def train_fields(metrics: dict[str, Any]) -> dict[str, str]:
    """What the display shows of a report: LM loss, exact accuracy at the last evaluation ('-'
    before the first one), throughput since the previous report."""
    def get(key: str, spec: str) -> str:
        value = metrics.get(key)
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    return {"loss": get("train/lm_loss", ".4f"), "eval_exact": get("eval/exact_accuracy", ".3f"),
            "samples/s": get("train/samples_per_s", ".0f")}


def show(progress: Progress, event: Event) -> None:
    if event.kind == "phase":
        logger.info("%s", event.text)
        progress.phase(event.text)
    elif event.kind == "start":
        logger.info("training from step %d", event.step)
        progress.start(event.step)
    elif event.kind == "step":
        progress.advance(event.step)
    else:
        progress.update(event.step, train_fields(event.metrics))


@contextmanager
def watching(progress: Progress, poll_s: float = POLL_S) -> Iterator[Any]:
    """Yields the inbox (``Remote``) to hand to rank 0; a thread shows its events until the block
    ends. The progress stays open: its owner closes it once the run has ended (after the upload)."""
    inbox = Inbox.remote()
    stop = threading.Event()

    def drain() -> bool:
        """Show what arrived; False once Ray is going down under a failed run."""
        try:
            events = ray.get(inbox.take.remote())
        except ray.exceptions.RayError:
            return False
        for event in events:
            show(progress, event)
        return True

    def loop() -> None:
        while not stop.wait(poll_s) and drain():
            progress.refresh()

    thread = threading.Thread(target=loop, name="urm_ray-progress", daemon=True)
    thread.start()
    try:
        yield Remote(inbox)
    finally:
        stop.set()
        thread.join()
        if drain():  # what came after the last poll (the final report)
            ray.kill(inbox)
