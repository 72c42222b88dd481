"""Tasks with one label per input and many valid answers: the trainer trains GRAM's prior decode
towards the target ``model.prior_match_targets`` names, and any model's answer decode towards the
one ``train.label_targets`` names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from urm_ray.data.store import DatasetMeta
from urm_ray.data.tasks import coloring
from urm_ray.data.tasks.verify import verifier_for
from urm_ray.errors import ConfigError
from urm_ray.objectives import GuidedObjective, Objective, objective_for
from urm_ray.train.step import train_step

from tiny import batch, config, trainer

N, K = 8, 3
SEQ = N * (N + 1)
META = DatasetMeta(task="coloring", vocab_size=coloring.COLOR0_TOKEN + K, seq_len=SEQ, num_puzzle_identifiers=1,
                   augmentation="coloring")


def _graphs(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    chunks = list(coloring.generate_graphs(N, count, colors=K, edge_prob=0.5, seed=7))
    inputs, labels = (np.concatenate([c[i] for c in chunks]) for i in (0, 1))
    return torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(labels.astype(np.int64))


def test_nearest_targets_are_valid_colourings_and_labels_where_the_answer_is_one():
    inputs, labels = _graphs(16)
    verify = verifier_for("coloring", SEQ)
    answers = torch.where(labels < 0, coloring.NO_EDGE_TOKEN, labels)
    answers[:8, 0] = coloring.COLOR0_TOKEN + (answers[:8, 0] - coloring.COLOR0_TOKEN + 1) % K  # node 0 recoloured
    assert not verify(answers, inputs, labels)[:8].all()
    choose = lambda choice: objective_for(  # noqa: E731
        config("gram_urm", extra=("model.prior_match=1.0", f"model.prior_match_targets={choice}")), META).prior
    assert choose("label") is None
    nearest = choose("nearest")(answers, inputs, labels)
    assert verify(nearest, inputs, labels).all()
    assert torch.equal(nearest[8:], labels[8:])  # an answer equal to its label keeps it
    assert ((nearest[:8] != answers[:8]) & (labels[:8] >= 0)).sum(-1).le(1).all()  # one node away at most


def test_the_step_trains_the_prior_decode_towards_the_search_targets():
    """Every row of the tiny batch is alone with its input: with a search that returns the
    decode itself, every prior decode equals its target (prior_exact = all rows)."""
    counts = {}
    for name, search in (("labels", None), ("own decode", lambda answers, inputs, labels: answers)):
        tiny = trainer("gram_urm", False, ("model.prior_match=1.0",), GuidedObjective(prior=search))
        torch.manual_seed(3)
        metrics = train_step(tiny, batch(0))
        counts[name] = int(metrics["prior_exact"])
    assert counts == {"labels": 0, "own decode": 8}


def test_label_targets_nearest_asks_the_task_for_its_search():
    hooks = lambda choice: objective_for(config("urm", extra=(f"train.label_targets={choice}",)), META)  # noqa: E731
    assert hooks("label") == Objective()
    inputs, labels = _graphs(4)
    answers = torch.where(labels < 0, coloring.NO_EDGE_TOKEN, labels)
    assert torch.equal(hooks("nearest").labels(answers, inputs, labels), labels)  # valid answers are their own target


def test_the_step_trains_the_answer_decode_towards_the_label_targets():
    """With a search that returns each row's own decode (where the label has a target), every
    supervised token's loss is that of its argmax, below the label's."""
    losses = {}
    for name, search in (("labels", None), ("own decode", lambda answers, inputs, labels: torch.where(
            labels < 0, labels, answers))):
        tiny = trainer("urm", False, objective=Objective(labels=search))
        torch.manual_seed(3)
        metrics = train_step(tiny, batch(0))
        losses[name] = float(metrics["lm_loss"])
    assert losses["own decode"] < losses["labels"]


def test_an_objective_that_asks_a_task_hook_needs_the_dataset():
    with pytest.raises(ConfigError, match="model.halt_target=verifier needs the dataset's task"):
        objective_for(config("gram", extra=("model.halt_target=verifier",)))
    assert isinstance(objective_for(config("gram"), META), GuidedObjective)
    assert type(objective_for(config("trm"), META)) is Objective
