"""Majority vote, coverage, and sampled / unconditional evaluation of a stochastic model."""

import pytest
import torch

from urm_ray.data.tasks.nqueens import valid_queens_mask
from urm_ray.models.gram import GRAMConfig
from urm_ray.models.registry import TaskSpec, build_model
from urm_ray.models.trm import TRMConfig
from urm_ray.eval.heldout import (
    SAMPLED_METRICS,
    evaluate_sampled,
    generate_unconditional,
    sample_answers,
    summarize,
)
from urm_ray.eval.voting import coverage, majority_vote

A, B, C = [1, 1], [2, 2], [3, 3]  # three answers of L = 2 tokens


def _answers(*rows):
    """answers [K, B, L] from one list of K answers per row."""
    return torch.tensor(rows).transpose(0, 1)


def test_vote_returns_the_most_frequent_answer():
    answers = _answers([A, B, B, C, B], [C, A, C, C, A])
    assert majority_vote(answers).tolist() == [B, C]


def test_vote_tie_goes_to_the_answer_sampled_first():
    # Row 0: B and A twice each, B seen first. Row 1: all distinct, so the first sample wins.
    answers = _answers([B, A, A, B, C], [C, A, B, [4, 4], [5, 5]])
    assert majority_vote(answers).tolist() == [B, C]
    # The choice follows sample order, not token values: swap the names, same positions win.
    assert majority_vote(_answers([A, B, B, A, C], [A, C, B, [4, 4], [5, 5]])).tolist() == [A, A]


def test_vote_compares_whole_answers():
    # Tokens agree position-wise with [1, 2] most often, but no sample IS [1, 2].
    answers = _answers([[1, 9], [7, 2], [1, 9], [8, 2]])
    assert majority_vote(answers).tolist() == [[1, 9]]


def test_coverage_counts_distinct_valid_answers():
    answers = _answers([A, B, A, C, B], [A, A, A, A, A])
    valid = torch.tensor([[True, True, True, False, True], [True] * 5]).T  # [K, B]
    assert coverage(answers, valid).tolist() == [2, 1]  # row 0: A and B (C invalid); row 1: A
    assert coverage(answers, torch.zeros(5, 2, dtype=torch.bool)).tolist() == [0, 0]


TASK = TaskSpec(vocab_size=3, seq_len=16, num_puzzle_identifiers=1)
TINY = {"hidden_size": 32, "num_heads": 2, "num_layers": 1, "h_cycles": 2, "l_cycles": 1, "puzzle_emb_dim": 0,
        "puzzle_emb_len": 0, "max_segments": 2, "latent_dim": 8}


def _batch(rows=3):
    inputs = torch.ones(rows, TASK.seq_len, dtype=torch.long)
    labels = torch.randint(1, 3, (rows, TASK.seq_len), generator=torch.Generator().manual_seed(0))
    return {"inputs": inputs, "labels": labels, "puzzle_identifiers": torch.zeros(rows, dtype=torch.long)}


def test_deterministic_model_samples_agree_with_evaluate_batch():
    torch.manual_seed(0)
    model = build_model(TRMConfig(**{k: v for k, v in TINY.items() if k != "latent_dim"}), TASK).eval()
    batch = _batch()
    answers, segments = sample_answers(model, batch, num_samples=4)
    assert answers.shape == (4, 3, TASK.seq_len) and segments == 2
    assert (answers == answers[:1]).all()  # no noise: every trajectory is the same
    sums = evaluate_sampled(model, batch, num_samples=4)
    assert sums["rows"] == 3 and sums["segments"] == 6 and sums["tokens"] == 3 * TASK.seq_len
    assert sums["coverage"] == sums["valid"] == sums["exact"]  # one answer per row, valid iff exact


def test_sampled_evaluation_of_gram_counts_distinct_answers():
    torch.manual_seed(0)
    model = build_model(GRAMConfig(**TINY), TASK).eval()
    batch = _batch(rows=2)
    seen_inputs = []

    def accept_all(answers, inputs, labels):
        seen_inputs.append(inputs)
        return torch.ones(answers.shape[0], dtype=torch.bool)

    sums = evaluate_sampled(model, batch, num_samples=6, verifier=accept_all)
    answers, _ = sample_answers(model, batch, num_samples=6)
    assert sums["valid"] == 2 and sums["sample_valid"] == 2
    # the verifier sees each sample's own input: sample-major repeats of the batch's inputs
    assert torch.equal(seen_inputs[0], batch["inputs"].repeat(6, 1))
    assert torch.equal(seen_inputs[1], batch["inputs"])
    assert 2 < sums["coverage"] <= 12  # the untrained prior's noise spreads the samples
    metrics = summarize(sums, SAMPLED_METRICS)
    assert metrics["eval/coverage"] == float(sums["coverage"]) / 2 and metrics["eval/vote_valid"] == 1.0


def test_sampling_refuses_training_mode():
    model = build_model(GRAMConfig(**TINY), TASK).train()
    with pytest.raises(ValueError, match="model.eval"):
        sample_answers(model, _batch(), num_samples=2)
    with pytest.raises(ValueError, match="num_samples=0"):
        sample_answers(model.eval(), _batch(), num_samples=0)


def test_generate_unconditional_from_a_blank_board():
    torch.manual_seed(0)
    model = build_model(GRAMConfig(**TINY), TASK).eval()
    boards = generate_unconditional(model, num_samples=5)
    assert boards.shape == (5, TASK.seq_len) and boards.dtype == torch.long
    assert valid_queens_mask(boards.numpy(), 4).shape == (5,)


def test_evaluate_batch_counts_verifier_accepted_answers():
    from urm_ray.eval.heldout import evaluate_batch, summarize

    model = build_model(TRMConfig(**{k: v for k, v in TINY.items() if k != "latent_dim"}), TASK).eval()
    batch = _batch(rows=3)
    plain = evaluate_batch(model, batch)
    assert plain["valid"] == plain["exact"]  # without a verifier, valid means exact
    answers = sample_answers(model, batch, num_samples=1)[0][0]  # [B, L] the model's answers
    first_row = lambda answers, inputs, labels: torch.tensor([True, False, False])  # noqa: E731
    judged = evaluate_batch(model, batch, verifier=first_row)
    assert judged["valid"] == 1 and judged["exact"] == plain["exact"]
    seen = []
    evaluate_batch(model, batch, verifier=lambda a, i, l: seen.append((a, i, l)) or torch.ones(3, dtype=torch.bool))
    assert torch.equal(seen[0][0], answers) and seen[0][1] is batch["inputs"]
    assert summarize(judged)["eval/valid_accuracy"] == pytest.approx(1 / 3)


def test_held_out_metrics_add_the_vote_and_coverage_only_when_sampling():
    from urm_ray.eval.heldout import held_out_metrics

    torch.manual_seed(0)
    model = build_model(GRAMConfig(**TINY), TASK).eval()
    batches = lambda: iter([_batch(rows=3), _batch(rows=2)])  # noqa: E731
    plain = held_out_metrics(model, batches)
    assert plain["eval/rows"] == 5 and "eval/coverage" not in plain
    accept_all = lambda answers, inputs, labels: torch.ones(answers.shape[0], dtype=torch.bool)  # noqa: E731
    sampled = held_out_metrics(model, batches, num_samples=4, verifier=accept_all)
    assert set(plain) < set(sampled) and sampled["eval/rows"] == 5
    assert sampled["eval/vote_valid"] == 1.0 and 1.0 < sampled["eval/coverage"] <= 4.0
    assert sampled["eval/valid_accuracy"] == 1.0  # the deterministic pass is judged too
    halved = held_out_metrics(model, batches, num_samples=4, verifier=accept_all,
                              reduce=lambda sums: {k: v / 2 for k, v in sums.items()})
    assert halved["eval/rows"] == 2.5  # the reduction is applied to the sums, before dividing
