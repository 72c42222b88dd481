"""Checkpoints: a resumed run continues bit for bit as the uninterrupted run (CPU), per-rank seeds,
and a checkpoint reaches the storage whole or not at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.fs
import pytest
import torch

from urm_ray.train import checkpoint
from urm_ray.train.checkpoint import Position
from urm_ray.train.step import train_step
from urm_ray.typed import to_dict

from tiny import batch, trainer


def _train(tiny, carry, steps: range):
    tiny.carry = carry
    for step in steps:
        train_step(tiny, batch(step))
    return tiny.carry


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
    resumed.position, restored = checkpoint.restore(checkpoint.load_state(tmp_path), resumed.model,
                                                    resumed.ema, resumed.optimizers)
    assert resumed.position.step == 3 and restored is not None
    carry_resumed = _train(resumed, restored, range(3, 6))
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name
    for name, shadow in straight.ema.shadow.items():
        assert torch.equal(shadow, resumed.ema.shadow[name]), name
    for name, state in carry.state.items():
        assert torch.equal(state, carry_resumed.state[name]), name

    fresh_rows = trainer(family, False)  # the same, but the rows in flight forgotten
    fresh_rows.position, _ = checkpoint.restore(checkpoint.load_state(tmp_path), fresh_rows.model,
                                                fresh_rows.ema, fresh_rows.optimizers)
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


def _checkpoint_folder(folder: Path) -> Path:
    folder.mkdir()
    (folder / checkpoint.STATE_FILE).write_bytes(os.urandom(2 << 20))
    (folder / checkpoint.CONFIG_FILE).write_text("train: {steps: 20}\n")
    return folder


def test_an_upload_is_renamed_into_place_whole(tmp_path: Path):
    source = _checkpoint_folder(tmp_path / "local")
    run = tmp_path / "storage" / "run"
    run.mkdir(parents=True)
    checkpoint.upload(source, pyarrow.fs.LocalFileSystem(), str(run / "checkpoint_2"), 20)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint_2"]  # no temporary left
    for name in (checkpoint.STATE_FILE, checkpoint.CONFIG_FILE):
        assert (run / "checkpoint_2" / name).read_bytes() == (source / name).read_bytes()


def test_a_write_that_fails_midway_leaves_nothing_and_names_the_step(tmp_path: Path):
    """A real failed write: the process may not write files over 1 MiB (RLIMIT_FSIZE, the
    kernel's EFBIG, as a full disk gives ENOSPC), and state.pt is 2 MiB. The earlier
    checkpoint stays, nothing of the new one does, and the error names the step and folder."""
    source = _checkpoint_folder(tmp_path / "local")
    run = tmp_path / "storage" / "run"
    (run / "checkpoint_1").mkdir(parents=True)
    dest = run / "checkpoint_2"
    script = (
        "import resource, signal\n"
        "from pathlib import Path\n"
        "import pyarrow.fs\n"
        "from urm_ray.train.checkpoint import upload\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))\n"
        f"upload(Path({str(source)!r}), pyarrow.fs.LocalFileSystem(), {str(dest)!r}, 20)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"urm_ray.errors.CheckpointWriteError: the checkpoint of step 20 could not "
                           f"be written to {dest} ("), last
    assert "nothing of it was kept there" in last
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint_1"]


def test_a_failed_worker_is_one_line_naming_its_rank_and_error():
    """What `urm-ray train` prints when a worker fails (e.g. its checkpoint write): the first
    failed rank's last error line, not Ray's WorkerGroupError with every worker's traceback."""
    from ray.train import WorkerGroupError

    from urm_ray.errors import TrainingFailed

    trace = ("Traceback (most recent call last):\n  File \"loop.py\", line 9, in _upload\n"
             "urm_ray.errors.CheckpointWriteError: the checkpoint of step 20 could not be written\n")
    err = WorkerGroupError("Training failed due to worker errors", {1: RuntimeError("later"),
                                                                     0: RuntimeError(trace)})
    failed = TrainingFailed.from_workers(err.worker_failures)
    assert str(failed) == ("worker rank 0: urm_ray.errors.CheckpointWriteError: the checkpoint of "
                           "step 20 could not be written")
