"""Checkpoints: a resumed run continues bit for bit as the uninterrupted run (CPU), per-rank seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from urm_ray.train import checkpoint
from urm_ray.train.checkpoint import Position
from urm_ray.typed import to_dict

from tiny import batch, trainer


def _train(tiny, carry, steps: range):
    for step in steps:
        carry, _ = tiny._step(carry, batch(step))
    return carry


@pytest.mark.parametrize("family", ["urm", "gram"])
def test_resume_is_bit_exact(family: str, tmp_path: Path):
    """Interrupt after 3 of 6 steps, restore into fresh objects with a scrambled RNG, train on:
    weights, EMA and the rows' states equal the uninterrupted run's exactly. ACT exploration
    (p = 0.5) and GRAM's noise draw random numbers every step, so the RNG state matters, and
    rows in flight, so the carry does."""
    torch.manual_seed(7)
    straight = trainer(family, False)
    carry = _train(straight, None, range(3))
    checkpoint.save(tmp_path, straight.model, straight.ema, straight.optimizers, Position(step=3),
                    to_dict(straight.cfg), [checkpoint.rank_state(carry)])
    carry = _train(straight, carry, range(3, 6))

    resumed = trainer(family, False)
    torch.manual_seed(12345)
    position, restored = checkpoint.restore(checkpoint.load_state(tmp_path), resumed.model, resumed.ema,
                                            resumed.optimizers)
    assert position.step == 3 and restored is not None
    carry_resumed = _train(resumed, restored, range(3, 6))
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name
    for name, shadow in straight.ema.shadow.items():
        assert torch.equal(shadow, resumed.ema.shadow[name]), name
    for name, state in carry.state.items():
        assert torch.equal(state, carry_resumed.state[name]), name

    fresh_rows = trainer(family, False)  # the same, but the rows in flight forgotten
    checkpoint.restore(checkpoint.load_state(tmp_path), fresh_rows.model, fresh_rows.ema, fresh_rows.optimizers)
    _train(fresh_rows, None, range(3, 6))
    assert not all(torch.equal(p, q) for p, q in zip(straight.model.parameters(), fresh_rows.model.parameters()))


def test_ranks_get_distinct_reproducible_seeds_and_their_own_state(tmp_path: Path):
    seeds = [checkpoint.rank_seed(0, rank) for rank in range(4)]
    assert len(set(seeds)) == 4 and seeds == [checkpoint.rank_seed(0, rank) for rank in range(4)]
    tiny = trainer("urm", False)
    states = []
    for rank in range(2):
        torch.manual_seed(checkpoint.rank_seed(0, rank))
        states.append(checkpoint.rank_state(None))
    checkpoint.save(tmp_path, tiny.model, tiny.ema, tiny.optimizers, Position(step=1),
                    to_dict(tiny.cfg), states)
    state = checkpoint.load_state(tmp_path)
    draws = []
    for rank in range(3):  # rank 2 did not exist when the checkpoint was written
        checkpoint.restore(state, tiny.model, tiny.ema, tiny.optimizers, rank=rank, seed=0)
        draws.append(torch.rand(3))
    torch.manual_seed(checkpoint.rank_seed(0, 1))
    assert torch.equal(draws[1], torch.rand(3))  # rank 1 continues from its own saved RNG
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
