"""Test-time compute (urm_ray.eval.testtime) on tiny models of every family: width 1 without noise
is the plain evaluation bit for bit, noise is seeded, the selections pick what they say, and the
verifier's pick is reported apart, views map their answers back onto the puzzle."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from urm_ray.data.augment import augment_batch, invert_batch
from urm_ray.data.tasks import nqueens, sudoku
from urm_ray.errors import ConfigError
from urm_ray.eval.config import EvalConfig
from urm_ray.eval.heldout import evaluate_batch
from urm_ray.eval.testtime import (
    Views,
    applied,
    evaluate_testtime,
    rollout,
    select_accepted,
    select_best,
    summarize,
    widths,
)

from tiny import FAMILIES, batch, trainer


def model_of(family: str) -> torch.nn.Module:
    return trainer(family, False).model.eval()


def own_answers(model: torch.nn.Module, data: dict[str, torch.Tensor]) -> torch.Tensor:
    """The plain evaluation's final answers, rolled as ``evaluate_batch`` rolls them."""
    carry = model.initial_carry(data)
    with torch.no_grad():
        while True:
            carry, outputs = model(carry, data)
            if bool(carry.halted.all()):
                return outputs["logits"].argmax(-1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_width_one_without_noise_is_the_plain_evaluation(family: str):
    model = model_of(family)
    data = batch(0)
    torch.manual_seed(0)  # GRAM samples from its prior: the same draws as the settings' seed 0
    answers = own_answers(model, data)
    data["labels"] = torch.where(torch.arange(16) % 3 == 0, answers, data["labels"])  # some rows right
    data["labels"][::2] = answers[::2]
    settings = EvalConfig()
    with applied(model, settings):
        torch.manual_seed(0)
        roll = rollout(model, data, 1, False)
        sums = evaluate_testtime(model, data, settings)
    assert torch.equal(roll.answers[-1, 0], answers)
    torch.manual_seed(0)
    plain = evaluate_batch(model, data)
    assert 0 < float(plain["exact"]) < 8
    for key in ("exact", "vote_exact", "q_exact", "confidence_exact"):
        assert float(sums[key]) == float(plain["exact"]), key
    report = summarize(sums, settings)
    assert report["passes_per_puzzle"] == model.max_segments * model.stack_passes
    assert report["width_curve"] == {1: report["exact_accuracy"]}
    assert list(report["depth_curve"]) == list(range(1, model.max_segments + 1))
    assert report["depth_curve"][model.max_segments] == report["exact_accuracy"]


@pytest.mark.parametrize("family", ["urm", "trm", "hrm"])
def test_noise_changes_the_answers_and_the_seed_fixes_them(family: str):
    model = model_of(family)
    data = batch(1)

    def answers(noise: float, seed: int) -> torch.Tensor:
        settings = EvalConfig(width=4, noise=noise, seed=seed)
        with applied(model, settings):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                return rollout(model, data, settings.width, False).answers[-1]

    quiet, noisy = answers(0.0, 0), answers(3.0, 0)
    assert torch.equal(quiet[0], quiet[3])  # no noise: every trajectory the same
    assert not torch.equal(noisy[0], noisy[1])  # noise: trajectories differ
    assert not torch.equal(quiet[0], noisy[0])
    assert torch.equal(noisy, answers(3.0, 0))
    assert not torch.equal(noisy, answers(3.0, 1))
    assert model.config.state_noise == 0.0  # restored on exit


def test_q_selection_takes_the_highest_halting_score():
    answers = torch.tensor([[[1, 1], [5, 5], [7, 7]],
                            [[2, 2], [6, 6], [8, 8]],
                            [[3, 3], [4, 4], [9, 9]]])  # [N=3, B=3, L=2]
    q = torch.tensor([[0.1, 2.0, -1.0],
                      [0.3, -5.0, -0.5],
                      [0.2, 1.0, -2.0]])  # [N, B]
    assert select_best(answers, q).tolist() == [[2, 2], [5, 5], [8, 8]]
    accepted = torch.tensor([[False, False, False], [False, True, False], [True, True, False]])
    assert select_accepted(answers, accepted).tolist() == [[3, 3], [6, 6], [7, 7]]  # none: the first


def test_confidence_is_the_mean_log_probability_of_the_decoded_answer_and_selects_by_it():
    """Each trajectory's confidence from the rollout equals the mean log-softmax of its argmax
    tokens, recomputed from a plain forward pass; the selection takes the most confident one."""
    model = model_of("trm")
    data = batch(5)
    settings = EvalConfig(width=3, noise=2.0, seed=3, select="confidence")
    with applied(model, settings):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            roll = rollout(model, data, settings.width, False)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            repeated = {k: v.repeat(3, *([1] * (v.ndim - 1))) for k, v in data.items()}
            carry = model.initial_carry(repeated)
            with torch.no_grad():
                while True:
                    carry, outputs = model(carry, repeated)
                    if bool(carry.halted.all()):
                        break
        best = outputs["logits"].float().log_softmax(-1).max(-1).values.mean(-1).view(3, -1)
        torch.testing.assert_close(roll.confidence[-1], best)
        assert not torch.equal(roll.confidence[-1, 0], roll.confidence[-1, 1])  # noise: they differ
        most = roll.confidence[-1].argmax(0)  # [B]
        data["labels"] = roll.answers[-1].gather(0, most.view(1, -1, 1).expand(1, *data["labels"].shape))[0]
        report = summarize(evaluate_testtime(model, data, settings), settings)
    assert report["confidence_exact_accuracy"] == report["exact_accuracy"] == 1.0


def final_answers(model: torch.nn.Module, data: dict[str, torch.Tensor], settings: EvalConfig) -> torch.Tensor:
    """[width, B, L]: each trajectory's last answer, drawn as ``evaluate_testtime`` draws them."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        return rollout(model, data, settings.width, False).answers[-1]


def test_the_verifiers_pick_is_reported_apart():
    model = model_of("urm")
    data = batch(2)
    settings = EvalConfig(width=4, noise=3.0, seed=5)
    with applied(model, settings):
        data["labels"] = final_answers(model, data, settings)[2]  # only trajectory 2 answers right, in every row
        vote = summarize(evaluate_testtime(model, data, settings), settings)
        oracle_settings = EvalConfig(width=4, noise=3.0, seed=5, select="verifier")
        oracle = summarize(evaluate_testtime(model, data, oracle_settings), oracle_settings)
    assert vote["oracle_exact_accuracy"] == 1.0
    assert vote["exact_accuracy"] == vote["vote_exact_accuracy"] < 1.0
    assert oracle["exact_accuracy"] == 1.0 and oracle["select"] == "verifier"
    assert vote["width_curve"].keys() == {1, 2, 4}


def test_validity_counts_every_answer_the_verifier_accepts_not_only_the_label():
    model = model_of("urm")
    data = batch(2)
    settings = EvalConfig(width=4, noise=3.0, seed=5)
    with applied(model, settings):
        answers = final_answers(model, data, settings)  # [4, B, L]
        valid = {tuple(a.tolist()) for a in answers[2:].flatten(0, 1)}  # trajectories 2 and 3: the "many answers"

        def verifier(candidates: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return torch.tensor([tuple(c.tolist()) in valid for c in candidates])

        data["labels"] = (answers[0] + 1) % 10  # the label: an answer no trajectory gives
        judged = summarize(evaluate_testtime(model, data, settings, verifier), settings)
        unjudged = summarize(evaluate_testtime(model, data, settings), settings)
    first_valid = sum(tuple(a.tolist()) in valid for a in answers[0]) / answers.shape[1]
    assert judged["exact_accuracy"] == judged["oracle_exact_accuracy"] == 0.0
    assert judged["oracle_valid_accuracy"] == 1.0  # every row has an accepted trajectory
    assert judged["width_valid_curve"][1] == pytest.approx(first_valid) and first_valid < 1.0
    assert judged["width_valid_curve"][4] == judged["vote_valid_accuracy"] == judged["valid_accuracy"]
    assert judged["depth_valid_curve"][model.max_segments] == judged["valid_accuracy"]
    assert judged["width_curve"] == {1: 0.0, 2: 0.0, 4: 0.0}
    for curve in ("depth", "width"):  # without a verifier, valid is exact
        assert unjudged[f"{curve}_valid_curve"] == unjudged[f"{curve}_curve"]
    assert unjudged["oracle_valid_accuracy"] == unjudged["oracle_exact_accuracy"]


def test_deeper_and_wider_than_trained_count_their_passes():
    model = model_of("urm")
    trained = model.max_segments
    settings = EvalConfig(width=3, segments=trained + 2, loops=5)
    with applied(model, settings):
        report = summarize(evaluate_testtime(model, batch(3), settings), settings)
        assert model.config.loops == 5
    assert model.config.loops == 3 and model.max_segments == trained  # restored on exit
    assert report["segments"] == trained + 2
    assert report["passes_per_puzzle"] == 3 * (trained + 2) * 5
    assert widths(3) == [1, 2, 3] and widths(16) == [1, 2, 4, 8, 16] and widths(1) == [1]


def test_halt_early_counts_only_the_segments_run():
    model = model_of("urm")
    with torch.no_grad():
        model.q_head.bias.fill_(5.0)  # every trajectory says halt at once
    settings = EvalConfig(width=2, halt_early=True)
    with applied(model, settings):
        report = summarize(evaluate_testtime(model, batch(4), settings), settings)
    assert report["passes_per_puzzle"] == 2 * 1 * model.stack_passes


def test_settings_a_model_cannot_take_fail_before_any_work():
    with pytest.raises(ConfigError, match="eval.noise=0.5: gram draws its trajectories from its prior"):
        with applied(model_of("gram"), EvalConfig(noise=0.5)):
            pass
    with pytest.raises(ConfigError, match="eval.loops=4: trm has no loops"):
        with applied(model_of("trm"), EvalConfig(loops=4)):
            pass
    with pytest.raises(ConfigError, match="eval.loops=1 must exceed model.truncation=1"):
        with applied(model_of("urm"), EvalConfig(loops=1)):
            pass
    with pytest.raises(ConfigError, match="eval.width=0 must be >= 1"):
        EvalConfig(width=0)
    with pytest.raises(ConfigError, match="eval.select='best' must be one of vote, q, confidence, verifier"):
        EvalConfig(select="best")  # type: ignore[arg-type]


def test_gram_trajectories_differ_through_its_prior():
    model = model_of("gram")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        answers = rollout(model, batch(5), 4, False).answers[-1]
    assert any(not torch.equal(answers[0], answers[i]) for i in range(1, 4))


@pytest.mark.parametrize("family", ["trm", "urm"])
def test_views_read_each_trajectory_its_augmentation_and_map_the_answers_back(family: str):
    model = model_of(family)
    data = batch(2)
    data["inputs"] = data["inputs"].clamp(min=1)  # sudoku tokens: blank 1, digits 2..5
    index = np.arange(8) * 7
    data["puzzle_index"] = torch.as_tensor(index)
    settings = EvalConfig(width=4, views=True, seed=3)
    with applied(model, settings):
        roll = rollout(model, data, 4, False, Views.of(sudoku.augment, data, 4, 3))
    inputs, labels = data["inputs"].numpy(), data["labels"].numpy()
    for view in range(4):
        aug = np.full(8, view)
        seen, seen_labels = augment_batch(sudoku.augment, inputs, labels, index, aug, 3)
        assert (view == 0) == np.array_equal(seen, inputs)  # every other view moves the board
        own = own_answers(model, {**data, "inputs": torch.as_tensor(seen), "labels": torch.as_tensor(seen_labels)})
        back = invert_batch(sudoku.augment, own.numpy(), inputs, labels, index, aug, 3)
        assert np.array_equal(roll.answers[-1, view].numpy(), back), view
    assert torch.equal(roll.answers[-1, 0], own_answers(model, data))
    assert any(not torch.equal(roll.answers[-1, 0], roll.answers[-1, v]) for v in range(1, 4))

    sums = evaluate_testtime(model, data, EvalConfig(views=True), augment=sudoku.augment)  # one view: itself
    assert float(sums["exact"]) == float(evaluate_batch(model, data)["exact"])


def test_views_need_a_task_with_an_augmentation():
    with pytest.raises(ConfigError, match="eval.views=true: the nqueens task has no augmentation"):
        EvalConfig(views=True).check_task(nqueens.TASK)
    EvalConfig(views=True).check_task(sudoku.TASK)
    with pytest.raises(ValueError, match="settings.views needs the task's augmentation"):
        evaluate_testtime(model_of("trm"), batch(0), EvalConfig(width=2, views=True))
