"""``urm-ray sample``: boards drawn from the empty input of a GRAM checkpoint, judged by the
task's verifier, with validity and distinctness reported."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from urm_ray.cli import main
from urm_ray.config import load_config
from urm_ray.data.tasks import nqueens
from urm_ray.models.registry import TaskSpec, build_model
from urm_ray.train import checkpoint
from urm_ray.typed import to_dict

TINY = ["model.hidden_size=16", "model.num_heads=2", "model.num_layers=1", "model.latent_dim=4",
        "model.max_segments=2"]


@pytest.fixture(scope="module")
def gram_checkpoint(tmp_path_factory) -> Path:
    """An untrained GRAM checkpoint on the 4 solutions of 6-queens (its samples are noise)."""
    root = tmp_path_factory.mktemp("sample")
    meta = nqueens.build_unconditional(root / "nq6", n=6, repeats=2)
    cfg = load_config("nqueens8-gram", [f"data.path={root / 'nq6'}", *TINY])
    torch.manual_seed(0)
    model = build_model(cfg.model, TaskSpec(meta.vocab_size, meta.seq_len, meta.num_puzzle_identifiers))
    folder = root / "ckpt"
    folder.mkdir()
    checkpoint.save(folder, model, None, [], checkpoint.Position(step=3), to_dict(cfg))
    return folder


def test_sample_reports_validity_and_distinctness_of_its_boards(gram_checkpoint, capsys):
    assert main(["sample", str(gram_checkpoint), "--num", "24", "--boards"]) == 0
    report = json.loads(capsys.readouterr().out)
    boards = np.array(report["boards"])
    assert boards.shape == (24, 36) and report["samples"] == 24 and report["task"] == "nqueens"
    valid = nqueens.valid_queens_mask(boards, 6)
    assert report["valid"] == pytest.approx(valid.mean())
    assert report["distinct"] == len({tuple(b) for b in boards.tolist()}) > 1  # stochastic
    assert report["distinct_valid"] == len({tuple(b) for b in boards[valid].tolist()})


def test_sample_is_seeded(gram_checkpoint, capsys):
    runs = []
    for seed in ("1", "1", "2"):
        assert main(["sample", str(gram_checkpoint), "--num", "8", "--boards", "--seed", seed]) == 0
        runs.append(json.loads(capsys.readouterr().out)["boards"])
    assert runs[0] == runs[1] != runs[2]


def test_sample_needs_a_positive_count(gram_checkpoint, capsys):
    assert main(["sample", str(gram_checkpoint), "--num", "0"]) == 2
    assert "--num 0" in capsys.readouterr().err


def test_sample_at_temperature_zero_draws_the_prior_mean(gram_checkpoint, capsys):
    assert main(["sample", str(gram_checkpoint), "--num", "8", "--temperature", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["temperature"] == 0 and report["distinct"] == 1  # one blank input, no noise


def test_sample_rejects_a_negative_temperature(gram_checkpoint, capsys):
    assert main(["sample", str(gram_checkpoint), "--temperature", "-1"]) == 2
    assert "--temperature -1.0" in capsys.readouterr().err


def test_eval_draws_its_prior_samples_at_the_given_temperature(gram_checkpoint, ray_local):
    from urm_ray.eval.offline import evaluate_checkpoint

    torch.manual_seed(0)  # the draws come from the global generator: a fixed outcome, not a flaky one
    noisy = evaluate_checkpoint(gram_checkpoint)
    cold = evaluate_checkpoint(gram_checkpoint, temperature=0.0)
    assert (noisy["temperature"], cold["temperature"]) == (1.0, 0.0)
    # at 0 every row's 8 draws are the prior mean: one answer per row, so the vote is each draw
    assert cold["eval/vote_token_accuracy"] == pytest.approx(cold["eval/token_accuracy"])
    assert noisy["eval/vote_token_accuracy"] != pytest.approx(noisy["eval/token_accuracy"])


def test_eval_rejects_a_temperature_for_a_model_without_samples(tmp_path, capsys):
    meta = nqueens.build_unconditional(tmp_path / "nq6", n=6, repeats=2)
    cfg = load_config("sudoku4-urm", [f"data.path={tmp_path / 'nq6'}", "model.hidden_size=16", "model.num_heads=2"])
    model = build_model(cfg.model, TaskSpec(meta.vocab_size, meta.seq_len, meta.num_puzzle_identifiers))
    (tmp_path / "ckpt").mkdir()
    checkpoint.save(tmp_path / "ckpt", model, None, [], checkpoint.Position(step=1), to_dict(cfg))
    assert main(["eval", str(tmp_path / "ckpt"), "--temperature", "0.5"]) == 2
    assert "--temperature: urm draws no samples" in capsys.readouterr().err


def test_a_loaded_checkpoint_evaluates_on_this_machines_gpu_else_the_cpu(gram_checkpoint):
    """``urm-ray eval``, ``sample`` and test-time evaluation load through ``load_checkpoint``: its
    model is on the device ``local_device`` chooses, the GPU when the process sees one."""
    from urm_ray.eval.offline import device_of, load_checkpoint
    from urm_ray.train.step import local_device

    expected = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    assert local_device() == local_device("auto") == expected and local_device("cpu") == torch.device("cpu")
    _, model = load_checkpoint(gram_checkpoint)
    assert {p.device for p in model.parameters()} == {expected} and device_of(model) == expected
    assert not model.training
