"""The training loop's hold on its data: the epoch iterator is closed as soon as training ends or
fails, not when the garbage collector gets to it (Ray Data's prefetch thread and the
SplitCoordinator's epoch would run on until then)."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from urm_ray.train.evaluation import InRun
from urm_ray.tracking import NullTracker
from urm_ray.train.hosts import ProcessHost
from urm_ray.train.batches import TrainBatches
from urm_ray.train.checkpoint import Position
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


def _loop(steps: int, rows: Rows, tmp_path: Path) -> tuple[Loop, TrainBatches]:
    tiny = trainer("urm", False)
    tiny.cfg = replace(tiny.cfg, train=replace(tiny.cfg.train, steps=steps, log_every=100),
                       eval=replace(tiny.cfg.eval, every=0), checkpoint=replace(tiny.cfg.checkpoint, every=0))
    evaluation = InRun(tiny.cfg, None, None, None, 0, None)  # eval.every=0 and steps it never reaches: not called
    loop = Loop(tiny, ProcessHost({"train": rows}, tmp_path, 1), NullTracker(), Sender(), evaluation)
    loop._report = lambda metrics: None  # the last step's evaluation reads no held-out split here
    return loop, TrainBatches(rows, 2, tiny.position, 0, 0, tiny.device)


def test_the_epoch_iterator_is_closed_when_training_ends(tmp_path: Path):
    rows = Rows()
    loop, batches = _loop(2, rows, tmp_path)
    loop.run(batches)
    assert rows.closed and loop.state.position.step == 2


def test_the_epoch_iterator_is_closed_when_a_step_fails(tmp_path: Path):
    rows = Rows(fail_after=1)  # the first step trains, the second batch fails
    with pytest.raises(RuntimeError, match="going down") as raised:
        loop, batches = _loop(5, rows, tmp_path)
        loop.run(batches)
    # the traceback (kept by ``raised``) still holds run's frame: only an explicit close ran
    assert raised.traceback and rows.closed


class Counted(Rows):
    """Rows that note each batch handed out, in order, and when the first one was asked for."""

    def __init__(self, per_epoch: int) -> None:
        super().__init__()
        self.per_epoch, self.handed, self.asked = per_epoch, [], threading.Event()

    def iter_torch_batches(self, **_: Any):
        self.asked.set()
        for index in range(self.per_epoch):
            self.handed.append(index)
            yield batch(index)


def test_the_first_batch_is_asked_for_before_the_loop_wants_it():
    rows = Counted(per_epoch=3)
    batches = TrainBatches(rows, 2, Position(), 0, 0, torch.device("cpu"))
    assert rows.asked.wait(10)  # nobody called next: the pipeline was started by the constructor
    first = next(batches)
    assert torch.equal(first["inputs"], batch(0)["inputs"]) and batches.position.batch == 1
    batches.close()


def test_batches_resume_at_the_saved_position_and_count_only_what_was_handed_out():
    position = Position(step=7, epoch=1, batch=2)
    rows = Counted(per_epoch=3)
    batches = TrainBatches(rows, 2, position, 0, 0, torch.device("cpu"))
    got = [next(batches) for _ in range(3)]  # epoch 1's last batch, then epoch 2's first two
    batches.close()
    assert torch.equal(got[0]["inputs"], batch(2)["inputs"]) and torch.equal(got[1]["inputs"], batch(0)["inputs"])
    assert (position.epoch, position.batch) == (2, 2)  # the same object the state saves
    assert rows.handed == [0, 1, 2, 0, 1]  # epoch 1's first two skipped; nothing read ahead after the first


def test_closing_before_the_first_batch_was_taken_closes_the_iterator():
    rows = Rows()
    batches = TrainBatches(rows, 2, Position(), 0, 0, torch.device("cpu"))
    batches.close()
    assert rows.closed
