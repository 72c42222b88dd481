"""Checkpoints load as data, never as code, and survive a crash.

- a checkpoint the earlier format wrote (tests/fixtures/checkpoint-v1: two ranks, an ACT carry
  dataclass, numpy's RNG tuple) still loads and restores; the format written now needs no
  allowlist at all;
- a crafted ``state.pt`` whose pickle runs a shell command is refused, with the command never
  run, by ``urm-ray eval``, by an evaluation sweep's ``checkpoint:`` before anything is created,
  and from an ``s3://`` checkpoint (moto server) for evaluation and for a Ray resume;
- a process killed (SIGKILL) in the middle of writing a checkpoint leaves the previous one
  whole, and the run resumes from it; the next write removes the cut-short folder;
- a newest checkpoint whose ``state.pt`` is truncated is passed over, with a warning naming it,
  on local run folders and on Ray/Tune checkpoints alike.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ray.train
import torch

from urm_ray.cli import main
from urm_ray.config import build_config
from urm_ray.errors import CheckpointError, CheckpointRefused
from urm_ray.models.act import ACTCarry
from urm_ray.train import checkpoint, hosts
from urm_ray.train.checkpoint import Position
from urm_ray.train.step import build_state, train_step
from urm_ray.typed import to_dict

from test_cloud import BUCKET, FAKE_AWS, client, s3  # noqa: F401 (s3: the moto server fixture)
from tiny import TASK, batch, trainer

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "checkpoint-v1"


class _RunsACommand:
    """Unpickles as ``os.system(command)``: what a crafted checkpoint does to a plain pickle load."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _crafted(folder: Path, marker: Path) -> Path:
    """A checkpoint folder (the fixture's config.yaml) whose state.pt runs ``touch marker``."""
    shutil.copytree(FIXTURE, folder)
    torch.save({"model": _RunsACommand(f"touch {marker}"), "ema": None, "optimizers": [],
                "position": {"step": 9, "epoch": 0, "batch": 0}, "ranks": []}, folder / checkpoint.STATE_FILE)
    return folder


def _with_step(source: Path, folder: Path, step: int) -> Path:
    """A copy of checkpoint folder ``source`` that says it was saved at ``step``."""
    shutil.copytree(source, folder)
    state = checkpoint.load_state(folder)
    state["position"]["step"] = step
    torch.save(state, folder / checkpoint.STATE_FILE)
    return folder


def _truncate(folder: Path) -> None:
    path = folder / checkpoint.STATE_FILE
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # what a write cut short leaves


# --- the format ------------------------------------------------------------------------------------

def test_a_checkpoint_of_the_earlier_format_loads_and_restores():
    state = checkpoint.load_state(FIXTURE)
    assert isinstance(state["ranks"][0]["carry"], ACTCarry)  # pickled as its class then
    cfg = build_config(checkpoint.load_config_dict(FIXTURE))
    tiny = build_state(cfg, TASK, torch.device("cpu"))
    position, carry = checkpoint.restore(state, tiny.model, tiny.ema, tiny.optimizers, rank=0)
    assert position == Position(step=2, epoch=0, batch=2)
    assert isinstance(carry, ACTCarry) and carry.halted.shape == (8,)
    for name, value in tiny.model.state_dict().items():
        assert torch.equal(value, state["model"][name]), name
    assert np.array_equal(np.random.get_state()[1], state["ranks"][0]["rng"]["numpy"][1])
    tiny.carry = carry
    train_step(tiny, batch(2))  # trains on from it
    assert tiny.carry.segments.shape == (8,)


def test_the_format_written_now_is_tensors_and_plain_values(tmp_path: Path):
    """No class and no numpy array in a new state.pt: ``torch.load(weights_only=True)`` reads it
    with no allowlist, and the carry and RNG states come back as they were."""
    tiny = trainer("urm", False)
    tiny.carry = None
    train_step(tiny, batch(0))
    np.random.seed(3)
    checkpoint.save(tmp_path, tiny.model, tiny.ema, tiny.optimizers, Position(step=1), to_dict(tiny.cfg),
                    [checkpoint.rank_state(tiny.carry)])
    expected = np.random.rand(3)
    plain = torch.load(tmp_path / checkpoint.STATE_FILE, weights_only=True)
    assert isinstance(plain["ranks"][0]["carry"], dict)
    np.random.seed(4)
    _, carry = checkpoint.restore(checkpoint.load_state(tmp_path), tiny.model, tiny.ema, tiny.optimizers)
    assert np.array_equal(np.random.rand(3), expected)
    assert isinstance(carry, ACTCarry) and torch.equal(carry.halted, tiny.carry.halted)
    for name, value in tiny.carry.state.items():
        assert torch.equal(carry.state[name], value), name


# --- crafted checkpoints ---------------------------------------------------------------------------

def test_a_crafted_state_is_refused_and_runs_nothing(tmp_path: Path):
    marker = tmp_path / "ran"
    folder = _crafted(tmp_path / "checkpoint_1", marker)
    torch.load(folder / checkpoint.STATE_FILE, weights_only=False)  # a plain pickle load runs it
    assert marker.exists()
    marker.unlink()
    with pytest.raises(CheckpointRefused) as refused:
        checkpoint.load_state(folder)
    assert str(refused.value).startswith(f"{folder / checkpoint.STATE_FILE}: refused: loading it would "
                                         "call or build posix.system")
    assert not marker.exists()


def test_urm_ray_eval_refuses_a_crafted_checkpoint(tmp_path: Path, capsys):
    marker = tmp_path / "ran"
    folder = _crafted(tmp_path / "checkpoint_1", marker)
    assert main(["eval", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    state = folder / checkpoint.STATE_FILE
    assert len(err) == 1 and err[0].startswith(f"urm-ray: error: {state}: refused"), err
    assert not marker.exists()


def test_an_evaluation_sweep_refuses_a_crafted_checkpoint_before_creating_anything(tmp_path: Path, capsys):
    marker = tmp_path / "ran"
    folder = _crafted(tmp_path / "checkpoint_1", marker)
    sweeps = tmp_path / "sweeps"
    assert main(["sweep", "testtime", f"checkpoint={folder}", "--dir", str(sweeps)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"urm-ray: error: search space testtime.yaml: checkpoint: "
                              f"{folder / checkpoint.STATE_FILE}: refused"), err
    assert not marker.exists() and not sweeps.exists()


def test_a_crafted_checkpoint_on_s3_is_refused_for_evaluation_and_resume(tmp_path: Path, s3, monkeypatch):
    """Read through pyarrow's S3 filesystem from a moto server: ``load_checkpoint`` (``urm-ray
    final``, ``eval`` of a URI) and a Ray Train / Tune resume (``hosts.load``) both refuse it,
    naming the object, and the older checkpoint beside it is no way around the refusal."""
    for key, value in {**FAKE_AWS, "AWS_ENDPOINT_URL": s3}.items():
        monkeypatch.setenv(key, value)
    marker = tmp_path / "ran"
    folder = _crafted(tmp_path / "crafted", marker)
    bucket = client(s3)
    for name in (checkpoint.CONFIG_FILE, checkpoint.STATE_FILE):
        bucket.upload_file(str(FIXTURE / name), BUCKET, f"refused/run/checkpoint_1/{name}")
        bucket.upload_file(str(folder / name), BUCKET, f"refused/run/checkpoint_2/{name}")
    uri = f"s3://{BUCKET}/refused/run/checkpoint_2"
    from urm_ray.evaluate import load_checkpoint

    named = "^" + re.escape(f"{uri}/{checkpoint.STATE_FILE}: refused")
    with pytest.raises(CheckpointRefused, match=named):
        load_checkpoint(uri)
    with pytest.raises(CheckpointRefused, match=named):
        hosts.load(ray.train.Checkpoint(uri))
    assert not marker.exists()


# --- crash safety ----------------------------------------------------------------------------------

def test_a_process_killed_mid_write_leaves_the_last_checkpoint_to_resume_from(tmp_path: Path):
    """SIGKILL to a process in the middle of ``persist_local`` (the write a run in the driver's
    process does): its state.pt comes from a pipe that is never finished, so the kill lands with
    part of it written. The run folder then holds the step-2 checkpoint whole and the cut-short
    write under its temporary name only; the run resumes at step 2, and its next write removes
    the leftover."""
    run = tmp_path / "run"
    checkpoint.persist_local(FIXTURE, run, step=2, keep=3)
    source = tmp_path / "step4"
    source.mkdir()
    shutil.copy(FIXTURE / checkpoint.CONFIG_FILE, source)
    os.mkfifo(source / checkpoint.STATE_FILE)
    script = ("import sys\nfrom pathlib import Path\nfrom urm_ray.train.checkpoint import persist_local\n"
              "persist_local(Path(sys.argv[1]), Path(sys.argv[2]), 4, 3)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(source), str(run)])
    sent = 3 << 19  # more than one read of the copy: it writes a part, then waits for the rest
    try:
        with os.fdopen(_open_for_writing(source / checkpoint.STATE_FILE, proc), "wb") as pipe:
            pipe.write(os.urandom(sent))
            pipe.flush()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not _written(run):
                time.sleep(0.05)
            assert 0 < _written(run) < sent  # the write is under way
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [p.name.startswith(checkpoint.PARTIAL) for p in run.iterdir()].count(True) == 1
    [complete] = checkpoint.saved_local(run)
    host = hosts.ProcessHost({}, run, keep=3)
    assert host.saved_state()["position"]["step"] == 2 and host.latest().path == str(complete)
    checkpoint.persist_local(FIXTURE, run, step=3, keep=3)  # the resumed run's next checkpoint
    assert not [p for p in run.iterdir() if p.name.startswith(checkpoint.PARTIAL)]
    assert len(checkpoint.saved_local(run)) == 2


def _open_for_writing(fifo: Path, reader: subprocess.Popen) -> int:
    """The pipe's writing end, once ``reader`` has opened it (it imports torch first)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while nobody reads
        except OSError as err:
            if err.errno != errno.ENXIO or reader.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        return fd


def _written(run: Path) -> int:
    partial = list(run.glob(f"{checkpoint.PARTIAL}*/{checkpoint.STATE_FILE}"))
    return partial[0].stat().st_size if partial else 0


def test_a_truncated_newest_checkpoint_is_passed_over_with_a_warning(tmp_path: Path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    older = shutil.copytree(FIXTURE, run / "checkpoint_2000-01-01_00-00-00.000000")
    newest = _with_step(FIXTURE, run / "checkpoint_2000-01-01_00-00-01.000000", 4)
    _truncate(newest)
    host = hosts.ProcessHost({}, run, keep=3)
    with caplog.at_level(logging.WARNING, logger="urm_ray.train.checkpoint"):
        assert host.saved_state()["position"]["step"] == 2
    assert host.latest().path == str(older)
    assert f"{newest / checkpoint.STATE_FILE}: truncated or corrupt" in caplog.text
    shutil.rmtree(older)  # with nothing older to fall back on, the run does not start afresh
    truncated = "^" + re.escape(f"{newest / checkpoint.STATE_FILE}: truncated or corrupt")
    with pytest.raises(CheckpointError, match=truncated):
        hosts.ProcessHost({}, run, keep=3).saved_state()


def test_a_ray_resume_passes_over_a_damaged_checkpoint_but_not_a_crafted_one(tmp_path: Path, caplog):
    """What a Tune trial (``checkpoint_<index>`` in its trial folder) or a Ray Train run resumes
    from: the registered checkpoint, else the newest earlier one that reads whole. A crafted one
    is refused outright."""
    trial = tmp_path / "trial"
    trial.mkdir()
    shutil.copytree(FIXTURE, trial / "checkpoint_000000")
    _with_step(FIXTURE, trial / "checkpoint_000001", 4)
    _truncate(_with_step(FIXTURE, trial / "checkpoint_000002", 6))
    _with_step(FIXTURE, trial / "checkpoint_000003", 8)  # newer than the registered one: not taken
    with caplog.at_level(logging.WARNING, logger="urm_ray.train.checkpoint"):
        state = hosts.load(ray.train.Checkpoint(str(trial / "checkpoint_000002")))
    assert state["position"]["step"] == 4
    assert str(trial / "checkpoint_000002" / checkpoint.STATE_FILE) in caplog.text
    marker = tmp_path / "ran"
    _crafted(trial / "checkpoint_000004", marker)
    with pytest.raises(CheckpointRefused):
        hosts.load(ray.train.Checkpoint(str(trial / "checkpoint_000004")))
    assert not marker.exists()
