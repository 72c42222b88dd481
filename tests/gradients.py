"""The truncated-gradient check the recurrent families share: the model's gradients equal those
of its update schedule written out by hand (``reference(model, batch) -> final z_H``)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

Reference = Callable[[nn.Module, dict], torch.Tensor]


def grads(model: nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every parameter's gradient of ``loss`` (None-gradient parameters left out)."""
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_matches_reference(model: nn.Module, batch: dict, reference: Reference) -> None:
    """A random probe of the logits plus both Q logits, backpropagated through one ACT segment
    and through ``reference``'s final state decoded by the same heads: the same gradients."""
    probe = torch.randn(*batch["labels"].shape, model.task.vocab_size)
    _, outputs = model(model.initial_carry(batch), batch)
    ours = grads(model, (outputs["logits"] * probe).sum() + outputs["q_halt_logits"].sum()
                 + outputs["q_continue_logits"].sum())
    z_H = reference(model, batch)
    theirs = grads(model, (model.lm_head(z_H[:, model.prefix_len:]) * probe).sum()
                   + model.q_head(z_H[:, 0]).sum())
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-6, msg=name)
