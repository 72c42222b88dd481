"""The progress display: formatting, plain lines and the bar, and rank 0's events reaching the
driver through a real Ray actor (the end-to-end output of `urm-ray train` is in test_train.py)."""

from __future__ import annotations

import logging

import pytest

from urm_ray.progress import Progress, format_duration, format_line, format_rate
from urm_ray.train.live import Sender, train_fields, watching


def test_durations_and_rates_read_like_a_clock():
    assert [format_duration(s) for s in (0, 7.4, 723, 3723, -5)] == ["0:00", "0:07", "12:03", "1:02:03", "0:00"]
    assert [format_rate(r) for r in (0.4234, 3.14, 396.6, 12500.2)] == ["0.42", "3.1", "397", "12500"]


def test_a_line_has_position_rate_elapsed_eta_and_fields():
    line = format_line("train", 50, 100, "steps", 10.0, 50, {"loss": "1.2345", "eval_exact": "-"})
    assert line == "train: 50/100 steps (5.0/s, 0:10, eta 0:10)  loss 1.2345  eval_exact -"
    # resumed at step 40: the rate counts only the 10 steps since the resume
    assert format_line("train", 50, 100, "steps", 5.0, 10) == "train: 50/100 steps (2.0/s, 0:05, eta 0:25)"
    assert format_line("validate", 300, 0, "rows", 2.0, 300) == "validate: 300 rows (150/s, 0:02)"


def test_train_fields_show_a_dash_before_the_first_evaluation():
    report = {"train/lm_loss": 1.23456, "train/samples_per_s": 396.6, "step": 50}
    assert train_fields(report) == {"loss": "1.2346", "eval_exact": "-", "samples/s": "397"}
    assert train_fields({**report, "eval/exact_accuracy": 0.41})["eval_exact"] == "0.410"


def test_plain_lines_at_each_update_or_throttled(caplog):
    caplog.set_level(logging.INFO, logger="urm_ray.progress")
    every = Progress("train", 30, unit="steps")
    for step in (10, 20, 30):
        every.advance(step - 5)  # steps between reports draw nothing off a terminal
        every.update(step, {"loss": f"{1 / step:.3f}"})
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" (")[0] for line in lines] == [f"train: {s}/30 steps" for s in (10, 20, 30)]
    assert lines[-1].endswith("loss 0.033")
    caplog.clear()
    throttled = Progress("build", 1000, unit="puzzles", every_s=3600)
    for done in range(100, 1001, 100):
        throttled.update(done)
    throttled.finish(1000)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["build: 1000/1000 puzzles"]


def test_on_a_terminal_a_bar_with_the_fields(capsys):
    bar = Progress("train", 100, unit="steps", live=True)
    bar.start(0)
    bar.advance(37)
    bar.update(50, {"loss": "1.2345"})
    bar.finish()
    err = capsys.readouterr().err
    assert "50/100" in err and "loss=1.2345" in err and "steps/s" in err


def test_a_phase_follows_the_description_until_the_position_moves_on(capsys):
    with Progress("train", 100, unit="steps", live=True) as bar:
        bar.start(0)
        bar.update(50, {"loss": "1.2345"})
        bar.phase("evaluating at step 50")
        assert "train (evaluating at step 50): " in capsys.readouterr().err
        bar.update(50, {"loss": "1.2000"})  # the report of that step: still evaluating
        assert bar.current_phase == "evaluating at step 50"
        bar.advance(51)
        assert bar.current_phase == ""
        bar.phase("uploading the checkpoint")
    err = capsys.readouterr().err
    assert "train (uploading the checkpoint): " in err and "51/100" in err
    assert bar._bar is None  # closed by the with block


def test_a_sender_without_an_inbox_does_nothing():
    sender = Sender(None)
    sender.phase("building the model")
    sender.start(0)
    sender.step(1)
    sender.report(10, {"train/lm_loss": 1.0})


@pytest.mark.slow
def test_rank_zero_events_reach_the_driver(ray_local, caplog):
    """What the loop sends arrives through the actor, in order: phase, start, steps, reports."""
    caplog.set_level(logging.INFO)
    progress = Progress("train", 20, unit="steps")
    with watching(progress, poll_s=0.05) as inbox:
        sender = Sender(inbox, every_s=0.0)
        sender.phase("building the model (urm) on 1 worker(s)")
        sender.start(0)
        for step in range(1, 21):
            sender.step(step)
            if step % 10 == 0:
                sender.report(step, {"train/lm_loss": 2.0 / step, "train/samples_per_s": 100.0,
                                     **({"eval/exact_accuracy": 0.5} if step == 20 else {})})
        sender.phase("saving the checkpoint at step 20")
    assert progress.current_phase == "saving the checkpoint at step 20"  # shown until its owner closes it
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:2] == ["building the model (urm) on 1 worker(s)", "training from step 0"]
    assert messages[-1] == "saving the checkpoint at step 20"
    lines = [m for m in messages if m.startswith("train: ")]
    assert [line.split(" (")[0] for line in lines] == ["train: 10/20 steps", "train: 20/20 steps"]
    assert lines[-1].endswith("loss 0.1000  eval_exact 0.500  samples/s 100")
    assert progress.done == 20
