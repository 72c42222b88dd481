"""Tests for urm_ray.losses: cross-entropies, the ACT loss head (vs the official fixtures) and the GRAM KL."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from urm_ray.errors import ConfigError
from urm_ray.losses import act_loss, gaussian_kl, guided_loss, softmax_cross_entropy, stablemax_cross_entropy


def _logits_and_labels(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(3, 5, 7, generator=gen)  # [B, L, V]
    labels = torch.randint(0, 7, (3, 5), generator=gen)
    labels[0, 1] = labels[2, 4] = -100
    labels[1, :] = -100  # a row without targets
    return logits, labels


def _stablemax_reference(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    def s(x: float) -> float:
        return x + 1 if x >= 0 else 1 / (1 - x)

    out = torch.zeros(labels.shape, dtype=torch.float64)
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            if labels[b, t] != -100:
                row = [s(float(x)) for x in logits[b, t]]
                out[b, t] = -math.log(row[int(labels[b, t])] / sum(row))
    return out


def test_stablemax_matches_explicit_formula() -> None:
    logits, labels = _logits_and_labels()
    losses = stablemax_cross_entropy(logits, labels)
    assert losses.dtype == torch.float64 and losses.shape == labels.shape
    torch.testing.assert_close(losses, _stablemax_reference(logits, labels), rtol=1e-12, atol=1e-12)
    assert (losses[labels == -100] == 0).all()


def test_softmax_matches_torch_cross_entropy() -> None:
    logits, labels = _logits_and_labels(1)
    losses = softmax_cross_entropy(logits, labels)
    expected = F.cross_entropy(logits.permute(0, 2, 1), labels, ignore_index=-100, reduction="none")
    assert losses.dtype == torch.float32 and losses.shape == labels.shape
    torch.testing.assert_close(losses, expected)
    assert (losses[labels == -100] == 0).all()


def test_custom_ignore_index() -> None:
    logits, labels = _logits_and_labels(2)
    labels = torch.where(labels == -100, 99, labels)
    for fn in (stablemax_cross_entropy, softmax_cross_entropy):
        losses = fn(logits, labels, ignore_index=99)
        assert (losses[labels == 99] == 0).all() and (losses[labels != 99] > 0).all()


def _outputs() -> dict[str, torch.Tensor]:
    logits = torch.full((3, 4, 5), -1.0)  # [B, L, V]
    predictions = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3], [4, 4, 4, 4]])
    logits.scatter_(-1, predictions.unsqueeze(-1), 2.0)
    return {
        "logits": logits,
        "q_halt_logits": torch.tensor([1.0, -2.0, 0.5]),
        "q_continue_logits": torch.tensor([0.3, 0.1, -0.4]),
    }


# Row 0 exactly right (3 valid tokens); row 1 half right (2 of 4); row 2 has no targets.
LABELS = torch.tensor([[0, 1, 2, -100], [0, 1, 0, 0], [-100, -100, -100, -100]])


def test_act_loss_terms() -> None:
    outputs = _outputs()
    outputs["target_q_continue"] = torch.tensor([0.9, 0.2, 0.5])
    loss, metrics = act_loss(outputs, LABELS, torch.ones(3, dtype=torch.bool), torch.tensor([2, 3, 4]))
    token = stablemax_cross_entropy(outputs["logits"], LABELS)
    lm = token[0].sum() / 3 + token[1].sum() / 4  # row 2 contributes 0
    seq_correct = torch.tensor([1.0, 0.0, 1.0])  # a row without targets counts as correct
    q_halt = F.binary_cross_entropy_with_logits(outputs["q_halt_logits"], seq_correct, reduction="sum")
    q_cont = F.binary_cross_entropy_with_logits(
        outputs["q_continue_logits"], outputs["target_q_continue"], reduction="sum"
    )
    torch.testing.assert_close(loss, lm + 0.5 * (q_halt + q_cont))
    torch.testing.assert_close(metrics["q_continue_loss"], q_cont)
    torch.testing.assert_close(metrics["lm_loss"], lm.float())
    assert metrics["count"] == 2  # row 2 has no targets
    torch.testing.assert_close(metrics["accuracy"], torch.tensor(1.0 + 0.5))
    assert metrics["exact_accuracy"] == 1 and metrics["act_segments"] == 5
    assert metrics["q_halt_accuracy"] == 2  # q>=0 agrees with correctness on rows 0 and 1
    assert all(v.dtype == torch.float32 and not v.requires_grad for v in metrics.values())


def test_act_loss_metrics_only_cover_halted_rows() -> None:
    halted = torch.tensor([False, True, True])
    loss, metrics = act_loss(_outputs(), LABELS, halted, torch.tensor([2, 3, 4]))
    assert "q_continue_loss" not in metrics
    assert metrics["count"] == 1 and metrics["exact_accuracy"] == 0 and metrics["act_segments"] == 3
    torch.testing.assert_close(loss, metrics["lm_loss"].double() + 0.5 * metrics["q_halt_loss"].double())


def test_act_loss_softmax_and_halt_target() -> None:
    outputs = _outputs()
    halted = torch.ones(3, dtype=torch.bool)
    _, metrics = act_loss(outputs, LABELS, halted, torch.ones(3), loss_type="softmax", halt_target=torch.ones(3))
    expected = F.binary_cross_entropy_with_logits(outputs["q_halt_logits"], torch.ones(3), reduction="sum")
    torch.testing.assert_close(metrics["q_halt_loss"], expected)
    with pytest.raises(ConfigError, match="loss_type='bogus'"):
        act_loss(outputs, LABELS, halted, torch.ones(3), loss_type="bogus")


@pytest.mark.parametrize("family", ["urm", "trm", "hrm"])
def test_act_loss_matches_official_fixture(family: str, reference_dir: Path) -> None:
    fixture = torch.load(reference_dir / family / "fixture.pt", weights_only=True)
    train, labels = fixture["train"], fixture["batch"]["labels"]
    halted = torch.ones(labels.shape[0], dtype=torch.bool)
    loss, metrics = act_loss(train, labels, halted, torch.ones(labels.shape[0]))
    lm = (stablemax_cross_entropy(train["logits"], labels) / (labels != -100).sum(-1, keepdim=True)).sum()
    torch.testing.assert_close(lm, train["lm_loss"], rtol=0, atol=1e-12)
    assert abs(metrics["lm_loss"].item() - fixture["loss"]) < 1e-5
    torch.testing.assert_close(metrics["q_halt_loss"], train["q_halt_loss_reference"])
    if "target_q_continue" in train:
        assert "q_continue_loss" in metrics


def _gaussians(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, 6, generator=gen, dtype=torch.float64) for _ in range(4)]


def test_gaussian_kl_zero_when_equal_and_matches_closed_form() -> None:
    mu, logvar, mu_p, logvar_p = _gaussians()
    torch.testing.assert_close(gaussian_kl(mu, logvar, mu, logvar), torch.zeros(4))
    kl = gaussian_kl(mu, logvar, mu_p, logvar_p)
    q = torch.distributions.Normal(mu, (0.5 * logvar).exp())
    p = torch.distributions.Normal(mu_p, (0.5 * logvar_p).exp())
    expected = torch.distributions.kl_divergence(q, p).flatten(1).sum(-1).float()
    assert kl.shape == (4,) and (kl > 0).all()
    torch.testing.assert_close(kl, expected, rtol=1e-5, atol=1e-5)


def test_gaussian_kl_balance_splits_gradients() -> None:
    alpha = 0.8
    plain_inputs = [t.float().requires_grad_() for t in _gaussians(1)]
    balanced_inputs = [t.detach().clone().requires_grad_() for t in plain_inputs]
    plain = gaussian_kl(*plain_inputs)
    balanced = gaussian_kl(*balanced_inputs, balance=alpha)
    torch.testing.assert_close(balanced, plain)
    plain.sum().backward()
    balanced.sum().backward()
    for i, (p, b) in enumerate(zip(plain_inputs, balanced_inputs)):
        share = 1 - alpha if i < 2 else alpha  # posterior (mu_q, logvar_q) gets 1 - alpha, prior alpha
        torch.testing.assert_close(b.grad, share * p.grad)
    with pytest.raises(ConfigError, match="balance=1.5"):
        gaussian_kl(*_gaussians(), balance=1.5)


def test_guided_loss_adds_a_models_aux_loss_to_the_act_loss() -> None:
    halted, steps = torch.ones(3, dtype=torch.bool), torch.ones(3)
    base, base_metrics = act_loss(_outputs(), LABELS, halted, steps)
    aux = torch.tensor(0.7, requires_grad=True)
    outputs = {**_outputs(), "aux_loss": aux, "kl": torch.tensor(7.0)}
    plain, plain_metrics = act_loss(outputs, LABELS, halted, steps)  # the official head: no extra term
    assert torch.equal(plain, base) and plain_metrics.keys() == base_metrics.keys()
    assert "kl" not in plain_metrics and "aux_loss" not in plain_metrics
    total, metrics = guided_loss(outputs, LABELS, halted, steps)
    torch.testing.assert_close(total, base + 0.7)
    total.backward()
    assert aux.grad == 1
    assert metrics["kl"] == 7.0 and metrics["aux_loss"] == 0.7 and not metrics["aux_loss"].requires_grad


def test_matched_answers_pair_each_inputs_answers_and_labels_one_to_one() -> None:
    from urm_ray.losses import matched_answers

    inputs = torch.tensor([[0, 0], [0, 0], [0, 0], [5, 5]])
    labels = torch.tensor([[1, 2], [3, 4], [1, 4], [1, 2]])
    # rows 0 and 1 both equal label 1: the nearest label would be [3, 4] for both; matched one to
    # one, row 1 keeps it (its own) and row 0 takes the next cheapest; row 3 is alone with its input
    answers = torch.tensor([[3, 4], [3, 4], [1, 4], [3, 4]])
    targets, distance = matched_answers(answers, inputs, labels)
    assert targets.tolist() == [[1, 2], [3, 4], [1, 4], [1, 2]]
    assert distance.tolist() == [2, 0, 0, 2]
    # every label of a group is some row's target
    assert sorted(map(tuple, targets[:3].tolist())) == sorted(map(tuple, labels[:3].tolist()))


def test_matched_answers_ignore_unsupervised_tokens_and_prefer_the_own_label() -> None:
    from urm_ray.losses import matched_answers

    inputs = torch.zeros(2, 3, dtype=torch.long)
    labels = torch.tensor([[1, 2, -100], [3, 3, -100]])
    targets, distance = matched_answers(torch.tensor([[3, 3, 8], [1, 2, 8]]), inputs, labels)
    assert targets.tolist() == [[3, 3, -100], [1, 2, -100]] and distance.tolist() == [0, 0]
    targets, _ = matched_answers(torch.tensor([[7, 7, 7], [7, 7, 7]]), inputs, labels)  # all equal
    assert torch.equal(targets, labels)


def test_matched_answer_loss_trains_towards_the_given_targets_of_every_row() -> None:
    from urm_ray.losses import matched_answer_loss

    labels = torch.tensor([[1, 2, -100], [3, 3, -100], [1, 1, -100]])
    searched = torch.tensor([[4, 4, -100], [2, 4, -100], [4, 4, -100]])
    logits = 9.0 * F.one_hot(torch.tensor([[4, 4, 0], [4, 4, 0], [4, 2, 0]]), 5).float()
    # a search's targets: row 0's decode equals its target, rows 1 and 2 differ from theirs in
    # one supervised token
    loss, exact = matched_answer_loss(logits, searched, "softmax")
    assert exact == 1
    expected = F.cross_entropy(logits.flatten(0, 1), searched.flatten(), ignore_index=-100, reduction="none")
    assert torch.allclose(loss, (expected.view(3, 3).sum(-1) / 2).sum())
    _, exact_labels = matched_answer_loss(logits, labels, "softmax")
    assert exact_labels == 0


def test_guided_loss_adds_the_prior_match_towards_the_matched_answers() -> None:
    from urm_ray.losses import matched_answers

    halted, steps = torch.ones(3, dtype=torch.bool), torch.ones(3)
    inputs = torch.zeros(3, 4, dtype=torch.long)
    labels = torch.randint(0, 5, (3, 4), generator=torch.Generator().manual_seed(3))
    base, _ = act_loss(_outputs(), labels, halted, steps, "softmax")
    prior = torch.randn(3, 4, 5)
    prior[0] = 9.0 * F.one_hot(labels[2], 5)  # row 0's prior draw decodes row 2's answer
    prior.requires_grad_()
    outputs = {**_outputs(), "prior_logits": prior, "prior_weight": torch.tensor(0.5)}
    with pytest.raises(ValueError, match="prior_targets"):
        guided_loss(outputs, labels, halted, steps, "softmax")
    targets, distance = matched_answers(prior.argmax(-1), inputs, labels)
    total, metrics = guided_loss(outputs, labels, halted, steps, "softmax", prior_targets=targets)
    expected = (softmax_cross_entropy(prior, targets).mean(-1)).sum()
    torch.testing.assert_close(total, base + 0.5 * expected)
    assert metrics["prior_exact"] == (distance == 0).sum() and metrics["prior_match_loss"] == expected.detach()
    total.backward()
    assert prior.grad.abs().sum() > 0
