"""The training loop's hold on its data: the epoch iterator is closed as soon as training ends or
fails, not when the garbage collector gets to it (Ray Data's prefetch thread and the
SplitCoordinator's epoch would run on until then)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from urm_ray.train.evaluation import InRun
from urm_ray.tracking import NullTracker
from urm_ray.train.hosts import ProcessHost
from urm_ray.train.live import Sender
from urm_ray.train.loop import Loop

from tiny import batch, trainer


class Rows:
    """A data source in place of a Ray Dataset: endless tiny batches, failing after ``fail_after``
    of them; records whether its iterator was closed."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.closed, self.fail_after = False, fail_after

    def iter_torch_batches(self, **_: Any):
        try:
            seed = 0
            while True:
                if seed == self.fail_after:
                    raise RuntimeError("the worker is going down")
                yield batch(seed)
                seed += 1
        finally:
            self.closed = True


def _loop(steps: int, rows: Rows, tmp_path: Path) -> Loop:
    tiny = trainer("urm", False)
    tiny.cfg = replace(tiny.cfg, train=replace(tiny.cfg.train, steps=steps, log_every=100),
                       eval=replace(tiny.cfg.eval, every=0), checkpoint=replace(tiny.cfg.checkpoint, every=0))
    evaluation = InRun(tiny.cfg, None, None, 0, None)  # eval.every=0 and steps it never reaches: not called
    loop = Loop(tiny, ProcessHost({"train": rows}, tmp_path, 1), NullTracker(), Sender(), evaluation)
    loop._report = lambda metrics: None  # the last step's evaluation reads no held-out split here
    return loop


def test_the_epoch_iterator_is_closed_when_training_ends(tmp_path: Path):
    rows = Rows()
    loop = _loop(2, rows, tmp_path)
    loop.run()
    assert rows.closed and loop.state.position.step == 2


def test_the_epoch_iterator_is_closed_when_a_step_fails(tmp_path: Path):
    rows = Rows(fail_after=1)  # the first step trains, the second batch fails
    with pytest.raises(RuntimeError, match="going down") as raised:
        _loop(5, rows, tmp_path).run()
    # the traceback (kept by ``raised``) still holds run's frame: only an explicit close ran
    assert raised.traceback and rows.closed
