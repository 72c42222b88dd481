"""Throttled progress logging for dataset builders that can run for minutes."""

import logging
import time

logger = logging.getLogger("urm_ray.data")


class Progress:
    """Logs `desc: done/total (rate/s)` at INFO at most once every `every_s` seconds."""

    def __init__(self, desc: str, total: int, every_s: float = 5.0):
        self.desc = desc
        self.total = total
        self.every_s = every_s
        self.start = time.monotonic()
        self.last = self.start

    def update(self, done: int) -> None:
        """Report `done` items finished so far (logs only when `every_s` has passed)."""
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._log(done, now)

    def finish(self, done: int) -> None:
        """Report the final count unconditionally."""
        self._log(done, time.monotonic())

    def _log(self, done: int, now: float) -> None:
        elapsed = max(now - self.start, 1e-9)
        logger.info(
            "%s: %d/%d (%.0f/s, %.1f s)", self.desc, done, self.total, done / elapsed, elapsed
        )
