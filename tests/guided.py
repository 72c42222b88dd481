"""Checks both GRAM cores share (``gram`` on TRM, ``gram_urm`` on URM): ACT roll-outs, guidance
head calls, and that the no-gradient transitions' KL trains only the guidance heads."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from gradients import grads

GUIDANCE = ("prior_head.", "posterior_head.", "label_embed.")


def roll(model: nn.Module, batch: dict, segments: int = 3) -> list[dict]:
    """Outputs of ``segments`` consecutive ACT calls on the same batch."""
    carry, outs = model.initial_carry(batch), []
    for _ in range(segments):
        carry, out = model(carry, batch)
        outs.append(out)
    return outs


def head_calls(model: nn.Module, batch: dict) -> tuple[dict[str, int], dict]:
    """How often one segment calls the prior and posterior heads, and its outputs."""
    calls = {"prior_head": 0, "posterior_head": 0}
    hooks = [getattr(model, name).register_forward_hook(lambda *_, n=name: calls.__setitem__(n, calls[n] + 1))
             for name in calls]
    _, outputs = model(model.initial_carry(batch), batch)
    for hook in hooks:
        hook.remove()
    return calls, outputs


def check_free_kl_trains_only_heads(make: Callable[[str], nn.Module], batch: dict, core: str) -> None:
    """``make(kl_transitions)`` builds the model: charging every transition ("all") changes the
    guidance heads' gradients and leaves every other one (the core's, named ``core``...) as with
    the gradient-carrying transitions' KL only ("last")."""
    by_mode = {}
    for transitions in ("all", "last"):
        torch.manual_seed(0)
        model = make(transitions).train()
        torch.manual_seed(1)  # the same noise draws in both
        _, outputs = model(model.initial_carry(batch), batch)
        by_mode[transitions] = grads(model, outputs["aux_loss"] + outputs["logits"].sum())
    for name, grad in by_mode["all"].items():
        if name.startswith(GUIDANCE):
            assert not torch.allclose(grad, by_mode["last"][name]), name
        else:
            torch.testing.assert_close(grad, by_mode["last"][name], rtol=1e-5, atol=1e-7, msg=name)
    assert any(name.startswith(core) for name in by_mode["all"])


def check_prior_match_pass(make: Callable[[float], nn.Module], batch: dict, transitions: int, core: str) -> None:
    """``make(prior_match)`` builds the model. With a prior match, training adds one prior-guided
    pass (``transitions`` more prior-head calls, the Q-halt decode then read from it) whose
    decode ``prior_logits`` trains the core and the prior head, not the posterior's side; without
    it, or at inference, there is none."""
    torch.manual_seed(0)
    calls_off, outputs_off = head_calls(make(0.0).train(), batch)
    assert "prior_logits" not in outputs_off
    torch.manual_seed(0)
    model = make(0.5).train()
    calls, outputs = head_calls(model, batch)
    assert calls == {"posterior_head": calls_off["posterior_head"],
                     "prior_head": calls_off["prior_head"] - 1 + transitions}
    assert outputs["prior_weight"] == 0.5 and torch.equal(outputs["halt_logits"], outputs["prior_logits"].detach())
    assert not torch.equal(outputs["prior_logits"], outputs["logits"])
    prior_grads = grads(model, outputs["prior_logits"].square().sum())
    assert any(name.startswith(core) for name in prior_grads) and any(n.startswith("prior_head.") for n in prior_grads)
    assert not any(name.startswith(("posterior_head.", "label_embed.")) for name in prior_grads)
    _, outputs = head_calls(model.eval(), batch)
    assert "prior_logits" not in outputs


def check_prior_match_start(make: Callable[[int], nn.Module], batch: dict) -> None:
    """``make(start)`` builds a model with the prior match from training step ``start``: the
    steps before it run no prior-guided pass, the steps from it do (as ``schedule`` sets them)."""
    model = make(3).train()
    seen = []
    for step in (0, 2, 3, 7):
        model.schedule(step)
        seen.append("prior_logits" in head_calls(model, batch)[1])
    assert seen == [False, False, True, True]
    assert "prior_logits" in head_calls(make(0).train(), batch)[1]
