"""GRAM on URM's core: registered, exactly URM without noise, a guided transition per loop pass
(posterior in training, prior at inference), KL at every pass, and the forward-only passes'
KL training only the guidance heads."""

import pytest
import torch

from urm_ray.models.gram_urm import GRAMURM, GRAMURMConfig
from urm_ray.models.registry import TaskSpec, build_model, config_class
from urm_ray.models.urm import URMConfig

from gradients import grads

TASK = TaskSpec(vocab_size=10, seq_len=12, num_puzzle_identifiers=3)
TINY = {"hidden_size": 32, "num_heads": 4, "num_layers": 1, "loops": 4, "truncation": 2,
        "puzzle_emb_dim": 32, "max_segments": 3, "latent_dim": 8}


def _roll(model, batch, segments=3):
    carry, outs = model.initial_carry(batch), []
    for _ in range(segments):
        carry, out = model(carry, batch)
        outs.append(out)
    return outs


def test_registered():
    assert config_class("gram_urm") is GRAMURMConfig
    model = build_model(GRAMURMConfig(**TINY), TASK)
    assert isinstance(model, GRAMURM) and model.config.kl_coef == 1.0


@pytest.mark.parametrize("train", [False, True])
def test_noise_off_is_exactly_urm(model_batch, train):
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="noise_scale=0"):
        gram = build_model(GRAMURMConfig(**{**TINY, "noise_scale": 0.0}), TASK)
    urm = build_model(URMConfig(**{k: v for k, v in TINY.items() if k != "latent_dim"}), TASK)
    assert gram.load_state_dict(urm.state_dict()) is not None  # the same weights, no extra ones
    gram.train(train), urm.train(train)
    batch = model_batch(TASK)
    torch.manual_seed(1)
    ours = _roll(gram, batch)
    torch.manual_seed(1)
    for mine, theirs in zip(ours, _roll(urm, batch)):
        for key in ("logits", "q_halt_logits", "q_continue_logits"):
            assert torch.equal(mine[key], theirs[key]), key


def _calls(model, batch):
    calls = {"prior_head": 0, "posterior_head": 0}
    hooks = [getattr(model, name).register_forward_hook(lambda *_, n=name: calls.__setitem__(n, calls[n] + 1))
             for name in calls]
    _, outputs = model(model.initial_carry(batch), batch)
    for hook in hooks:
        hook.remove()
    return calls, outputs


def test_every_loop_pass_is_a_guided_transition(model_batch):
    torch.manual_seed(0)
    model = build_model(GRAMURMConfig(**TINY), TASK)
    batch = model_batch(TASK)
    calls, outputs = _calls(model.train(), batch)
    # 4 passes: the posterior guides each, the prior is charged at each, plus the Q-halt decode
    assert calls == {"posterior_head": 4, "prior_head": 5}
    assert outputs["kl"] > outputs["kl_first"] + outputs["kl_last"] > 0  # the middle passes count
    assert outputs["aux_loss"].requires_grad and "halt_logits" in outputs
    calls, outputs = _calls(model.eval(), batch)
    assert calls == {"posterior_head": 0, "prior_head": 4} and "aux_loss" not in outputs
    assert not torch.equal(_roll(model, batch, 1)[0]["logits"], _roll(model, batch, 1)[0]["logits"])


def test_forward_only_passes_kl_trains_only_the_heads(model_batch):
    """Charging the truncated passes changes the heads' and label embedding's gradients only."""
    batch = model_batch(TASK)
    by_mode = {}
    for transitions in ("all", "last"):
        torch.manual_seed(0)
        model = build_model(GRAMURMConfig(**{**TINY, "kl_transitions": transitions}), TASK).train()
        torch.manual_seed(1)  # the same noise draws in both
        _, outputs = model(model.initial_carry(batch), batch)
        by_mode[transitions] = grads(model, outputs["aux_loss"] + outputs["logits"].sum())
    heads = ("prior_head.", "posterior_head.", "label_embed.")
    for name, grad in by_mode["all"].items():
        if name.startswith(heads):
            assert not torch.allclose(grad, by_mode["last"][name]), name
        else:
            torch.testing.assert_close(grad, by_mode["last"][name], rtol=1e-5, atol=1e-7, msg=name)
    assert any(name.startswith("blocks.") for name in by_mode["all"])
