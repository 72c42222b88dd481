"""Training objectives: what a step's loss is. The step asks its objective; no family is named.

- ``Objective``: the official ACT loss head (``losses.act_loss``), for every deterministic family.
- ``GuidedObjective``: the variational objective of a model with guidance (GRAM on TRM's or URM's
  core, ``GuidanceConfig``): the ACT loss with its Q-halt judged on a prior-guided decode (or by
  the task's verifier), the model's KL term, and with prior match the prior decode trained
  towards labels matched one to one to the draws (``losses.guided_loss``).

Which one a config trains is its family's ``FamilySpec.objective`` (urm_ray/models/registry.py).

An objective has an eager part, the targets only a task can give (a verifier, a nearest search,
the matching, all on the CPU), and a tensor part, ``loss``, that ``compiled`` hands to
torch.compile whole::

    objective = objective_for(cfg, meta)        # ConfigError where the task lacks a hook it asks for
    loss, metrics = objective(outputs, carry)   # the carry's rows, after the model's forward

Host work: the eager part is the training step's only host work, and only where a config asks
for it (``model.halt_target: verifier``, ``model.prior_match`` > 0, ``*_targets: nearest``):
each hook copies this step's decoded boards to the host in one copy (a sync on a GPU), runs
the task's numpy check or scipy's assignment, and copies its targets back. They judge the
decodes of the step itself, so they cannot move to the data pipeline or to report steps, and an
exact minimum-cost assignment has no static-shape form on the device. Every other objective,
GRAM's default guidance included, reads nothing back (tests/test_step_syncs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from urm_ray.config import RunConfig
from urm_ray.data.store import DatasetMeta
from urm_ray.data.tasks.verify import Search, Verifier, nearest_for, verifier_for
from urm_ray.errors import ConfigError
from urm_ray.losses import act_loss, guided_loss, matched_answers
from urm_ray.models.registry import family

LossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class Objective:
    """The ACT objective. ``labels``: the answer loss's targets from the rows' own decodes
    (``train.label_targets: nearest``; None: the rows' labels)."""

    loss_type: str = "stablemax"
    labels: Search | None = None
    loss: LossFn = act_loss

    def __call__(self, outputs: dict[str, Tensor], carry: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss and metric sums of one ACT segment of ``carry``'s rows."""
        return self.loss(outputs, self.answer_targets(outputs, carry.current_data), carry.halted, carry.segments,
                         self.loss_type)

    def answer_targets(self, outputs: dict[str, Tensor], data: dict[str, Tensor]) -> Tensor:
        if self.labels is None:
            return data["labels"]
        return self.labels(outputs["logits"].detach().argmax(-1), data["inputs"], data["labels"])

    def compiled(self) -> Objective:
        """The same objective with its tensor part compiled (the float64 stablemax and the
        metrics fuse into a few kernels)."""
        return replace(self, loss=torch.compile(self.loss, dynamic=False))


@dataclass(frozen=True)
class GuidedObjective(Objective):
    """The variational objective. ``halt``: the Q-halt label "the task's verifier accepts the
    prior-guided decode" (``model.halt_target: verifier``; None: it equals the label);
    ``prior``: the prior match's targets from a task's search (``model.prior_match_targets:
    nearest``; None: the batch's labels for the same input, matched to the draws)."""

    halt: Verifier | None = None
    prior: Search | None = None
    loss: LossFn = guided_loss

    def __call__(self, outputs: dict[str, Tensor], carry: Any) -> tuple[Tensor, dict[str, Tensor]]:
        data = carry.current_data
        labels = self.answer_targets(outputs, data)
        halt_target = prior_targets = None
        if self.halt is not None:
            judged = outputs.get("halt_logits", outputs["logits"])
            halt_target = self.halt(judged.detach().argmax(-1), data["inputs"], data["labels"])
        if "prior_logits" in outputs:  # matched here, eagerly: the matching runs on the CPU (scipy)
            answers = outputs["prior_logits"].detach().argmax(-1)
            prior_targets = (self.prior(answers, data["inputs"], data["labels"]) if self.prior is not None
                             else matched_answers(answers, data["inputs"], labels)[0])
        return self.loss(outputs, labels, carry.halted, carry.segments, self.loss_type, halt_target=halt_target,
                         prior_targets=prior_targets)


def objective_for(cfg: RunConfig, meta: DatasetMeta | None = None) -> Objective:
    """The objective ``cfg`` trains, with the task hooks it asks for from ``meta``'s task;
    ConfigError where the task has no such verifier or search (the driver asks before Ray starts)."""

    def task(key: str) -> DatasetMeta:
        if meta is None:
            raise ConfigError(f"{key} needs the dataset's task, and none was given")
        return meta

    labels = halt = prior = None
    if cfg.train.label_targets == "nearest":
        m = task("train.label_targets=nearest")
        labels = nearest_for(m.task, m.seq_len, m.vocab_size)
    if family(cfg.model.name).objective == "act":
        return Objective(cfg.train.loss, labels)
    if cfg.model.halt_target == "verifier":
        m = task("model.halt_target=verifier")
        halt = verifier_for(m.task, m.seq_len)
    if cfg.model.prior_match_targets == "nearest":
        m = task("model.prior_match_targets=nearest")
        prior = nearest_for(m.task, m.seq_len, m.vocab_size)
    return GuidedObjective(cfg.train.loss, labels, halt=halt, prior=prior)
