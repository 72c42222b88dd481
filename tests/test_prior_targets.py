"""GRAM's prior match on a task with one label per input and many valid answers: the trainer
trains a row's prior decode towards the target ``model.prior_match_targets`` names."""

from __future__ import annotations

import numpy as np
import torch

from urm_ray.data.store import DatasetMeta
from urm_ray.data.tasks import coloring
from urm_ray.data.tasks.verify import verifier_for
from urm_ray.train.loop import _prior_targets

from tiny import batch, trainer

N, K = 8, 3
SEQ = N * (N + 1)
META = DatasetMeta(task="coloring", vocab_size=coloring.COLOR0_TOKEN + K, seq_len=SEQ, num_puzzle_identifiers=1,
                   augmentation="coloring")


def _graphs(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    chunks = list(coloring.generate_graphs(N, count, colors=K, edge_prob=0.5, seed=7))
    inputs, labels = (np.concatenate([c[i] for c in chunks]) for i in (0, 1))
    return torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(labels.astype(np.int64))


def test_each_choice_gives_its_targets():
    inputs, labels = _graphs(16)
    verify = verifier_for("coloring", SEQ)
    answers = torch.where(labels < 0, coloring.NO_EDGE_TOKEN, labels)
    answers[:8, 0] = coloring.COLOR0_TOKEN + (answers[:8, 0] - coloring.COLOR0_TOKEN + 1) % K  # node 0 recoloured
    cfg = lambda choice, halt="verifier": trainer("gram_urm", False, (  # noqa: E731
        f"model.prior_match_targets={choice}", f"model.halt_target={halt}")).cfg
    assert _prior_targets(cfg("label", "label"), META, None) is None
    nearest = _prior_targets(cfg("nearest"), META, verify)(answers, inputs, labels)
    assert verify(nearest, inputs, labels).all()
    assert torch.equal(nearest[8:], labels[8:])  # an answer equal to its label keeps it
    verified = _prior_targets(cfg("verified"), META, verify)(answers, inputs, labels)
    accepted = verify(answers, inputs, labels)
    assert not accepted.all() and accepted[8:].all()
    kept = torch.where(labels >= 0, answers, labels)
    assert torch.equal(verified[accepted], kept[accepted]) and torch.equal(verified[~accepted], labels[~accepted])


def test_the_step_trains_the_prior_decode_towards_the_search_targets():
    """Every row of the tiny batch is alone with its input: with a search that returns the
    decode itself, every prior decode equals its target (prior_exact = all rows)."""
    counts = {}
    for name, search in (("labels", None), ("own decode", lambda answers, inputs, labels: answers)):
        tiny = trainer("gram_urm", False, ("model.prior_match=1.0",))
        tiny.prior_targets = search
        torch.manual_seed(3)
        _, metrics = tiny._step(None, batch(0))
        counts[name] = int(metrics["prior_exact"])
    assert counts == {"labels": 0, "own decode": 8}
