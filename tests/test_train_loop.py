"""The training loop's hold on its data: the epoch iterator is closed as soon as training ends or
fails, not when the garbage collector gets to it (Ray Data's prefetch thread and the
SplitCoordinator's epoch would run on until then)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from urm_ray.train.checkpoint import Position

from tiny import batch, trainer


class Batches:
    """Stands in for ``Trainer._batches``: endless tiny batches; records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def __call__(self, position: Position):
        try:
            seed = 0
            while True:
                yield batch(seed)
                seed += 1
        finally:
            self.closed = True


def _tiny(steps: int):
    tiny = trainer("urm", False)
    tiny.cfg = replace(tiny.cfg, train=replace(tiny.cfg.train, steps=steps))
    tiny._batches = Batches()
    tiny._report = lambda position, metrics, carry: None  # no Ray Train session here
    return tiny


def test_the_epoch_iterator_is_closed_when_training_ends():
    tiny = _tiny(steps=2)
    tiny.run(Position())
    assert tiny._batches.closed


def test_the_epoch_iterator_is_closed_when_a_step_fails():
    tiny = _tiny(steps=5)
    steps = [tiny._step]  # the first step trains, the second fails

    def step(carry, batch):
        if not steps:
            raise RuntimeError("the worker is going down")
        return steps.pop()(carry, batch)

    tiny._step = step
    with pytest.raises(RuntimeError, match="going down") as raised:
        tiny.run(Position())
    # the traceback (kept by ``raised``) still holds run's frame: only an explicit close ran
    assert raised.traceback and tiny._batches.closed
