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
    assert (report["mode"], report["step"]) == ("sample", 3)
    valid = nqueens.valid_queens_mask(boards, 6)
    assert report["sample/valid"] == pytest.approx(valid.mean())
    assert report["sample/distinct"] == len({tuple(b) for b in boards.tolist()}) > 1  # stochastic
    assert report["sample/distinct_valid"] == len({tuple(b) for b in boards[valid].tolist()})


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
    assert report["temperature"] == 0 and report["sample/distinct"] == 1  # one blank input, no noise


def test_sample_rejects_a_negative_temperature(gram_checkpoint, capsys):
    assert main(["sample", str(gram_checkpoint), "--temperature", "-1"]) == 2
    assert "--temperature -1.0" in capsys.readouterr().err


def test_eval_draws_its_prior_samples_at_the_given_temperature(gram_checkpoint, ray_local):
    from urm_ray.eval.config import EvalConfig
    from urm_ray.evaluate import Request, evaluate

    torch.manual_seed(0)  # the draws come from the global generator: a fixed outcome, not a flaky one
    noisy, cold = (evaluate(gram_checkpoint, EvalConfig(), Request(temperature=t)) for t in (None, 0.0))
    assert (noisy.details["temperature"], cold.details["temperature"]) == (1.0, 0.0)
    noisy, cold = noisy.metrics, cold.metrics
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
    """``urm-ray eval``, ``sample`` and test-time evaluation load through ``urm_ray.evaluate.load``: its
    model is on the device ``local_device`` chooses, the GPU when the process sees one."""
    from urm_ray.evaluate import load_checkpoint
    from urm_ray.train.step import local_device

    expected = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    assert local_device() == local_device("auto") == expected and local_device("cpu") == torch.device("cpu")
    _, model = load_checkpoint(gram_checkpoint)
    assert {p.device for p in model.parameters()} == {expected}
    assert not model.training
