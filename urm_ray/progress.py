"""A counter for long work (training steps, evaluated rows, generated puzzles), with rate and ETA.

    progress = Progress("train", total=1500, unit="step", live=sys.stderr.isatty())
    progress.start(0)                          # a resumed run starts at its checkpoint's step
    progress.advance(37)                       # position only: the bar moves
    progress.update(50, {"loss": "1.2345"})    # position and fields: the bar, or a plain line
    progress.phase("evaluating at step 1500")  # on the bar: "train (evaluating at step 1500): ..."
    progress.finish(1500)                      # or ``with Progress(...) as progress:``, closed at exit

``live`` (a terminal): a tqdm bar on stderr; log records are written above it while it is open.
A phase names what happens at the current position (the last evaluation, saving a checkpoint);
the bar shows it after its description until the position moves on. Otherwise (a log file, CI):
one plain line per ``update`` through logging, at most one every ``every_s`` seconds, and one at
``finish``:

    train: 50/1500 step (3.1/s, 0:16, eta 7:48)  loss 1.2345  eval_exact -  samples/s 397
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import ExitStack
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm import tqdm

logger = logging.getLogger("urm_ray.progress")

DATA_PROGRESS_EVERY_S = 5.0  # building a dataset: a plain progress line at most this often


def format_duration(seconds: float) -> str:
    """``0:07``, ``12:03``, ``1:02:03`` (hours only when there are any)."""
    minutes, secs = divmod(int(round(max(seconds, 0.0))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_rate(per_s: float) -> str:
    """``0.42``, ``3.1``, ``397``, ``12500``: two decimals below 1, one below 10, else none."""
    return f"{per_s:.2f}" if per_s < 1 else f"{per_s:.1f}" if per_s < 10 else f"{per_s:.0f}"


def format_line(desc: str, done: int, total: int, unit: str, elapsed_s: float, counted: int,
                fields: dict[str, str] | None = None) -> str:
    """One plain progress line. ``counted``: items done since the clock started (the rate's
    numerator; less than ``done`` for a resumed run). No total (0): no ETA."""
    rate = counted / elapsed_s if elapsed_s > 0 else 0.0
    position = f"{done}/{total}" if total else f"{done}"
    timing = [f"{format_rate(rate)}/s", format_duration(elapsed_s)]
    if total and rate > 0:
        timing.append(f"eta {format_duration((total - done) / rate)}")
    extra = "".join(f"  {key} {value}" for key, value in (fields or {}).items())
    return f"{desc}: {position} {unit} ({', '.join(timing)}){extra}"


class Progress:
    """``done`` out of ``total`` (0: unknown) items of ``unit``; see the module docstring."""

    def __init__(self, desc: str, total: int, *, unit: str = "it", every_s: float = 0.0,
                 live: bool = False) -> None:
        self.desc, self.total, self.unit, self.every_s, self.live = desc, total, unit, every_s, live
        self.done = self.first = 0
        self.fields: dict[str, str] = {}
        self.current_phase = ""  # what happens at ``phase_at`` ("" = the counted work itself)
        self.phase_at = 0
        self.started = time.monotonic()
        self._last_line = self.started
        self._bar: tqdm | None = None
        self._stack = ExitStack()

    def start(self, done: int = 0) -> None:
        """Start (or restart) the clock at ``done``; the rate counts from here."""
        self.done = self.first = done
        self.started = time.monotonic()
        self.phase("")
        if self._bar is not None:
            self._bar.reset(total=self.total or None)
            self._bar.update(done)
        elif self.live:
            self._open()

    def advance(self, done: int) -> None:
        """Move to ``done`` without new fields: the bar moves; no plain line."""
        self.done = done
        if self.current_phase and done > self.phase_at:
            self.phase("")
        if self._bar is not None and done > self._bar.n:
            self._bar.update(done - self._bar.n)

    def update(self, done: int, fields: dict[str, str] | None = None) -> None:
        """Move to ``done`` with these fields (kept until replaced)."""
        self.fields.update(fields or {})
        if self.live and self._bar is None:
            self._open()
        self.advance(done)
        if self._bar is not None:
            self._bar.set_postfix(self.fields, refresh=True)
        elif time.monotonic() - self._last_line >= self.every_s:
            self._line()

    def phase(self, text: str) -> None:
        """Name what happens at the current position ("" clears it); only the bar shows it (the
        caller logs what a plain log should say)."""
        self.current_phase, self.phase_at = text, self.done
        if self._bar is not None:
            self._bar.set_description(self._description(), refresh=True)

    def finish(self, done: int | None = None) -> None:
        """The final position (a plain line even inside ``every_s``), then close."""
        if done is not None:
            self.advance(done)
        if self._bar is None:
            self._line()
        self.close()

    def refresh(self) -> None:
        """Redraw the bar (its elapsed time and ETA move on between updates)."""
        if self._bar is not None:
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._stack.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self) -> str:
        return format_line(self.desc, self.done, self.total, self.unit,
                           time.monotonic() - self.started, self.done - self.first, self.fields)

    def _line(self) -> None:
        self._last_line = time.monotonic()
        logger.info("%s", self.line())

    def _open(self) -> None:
        # imported here: the dataset tasks import this module where tqdm may be absent
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._bar = tqdm(total=self.total or None, initial=self.done, desc=self._description(),
                         unit=self.unit, file=sys.stderr, dynamic_ncols=True, leave=True)
        self._stack.enter_context(logging_redirect_tqdm())  # log records above the bar

    def _description(self) -> str:
        return f"{self.desc} ({self.current_phase})" if self.current_phase else self.desc
