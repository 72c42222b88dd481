"""GRAM on URM's core: registered, exactly URM without noise, a guided transition per loop pass
(posterior in training, prior at inference), KL at every pass, and the forward-only passes'
KL training only the guidance heads."""

import pytest
import torch

from urm_ray.models.gram_urm import GRAMURM, GRAMURMConfig
from urm_ray.models.registry import TaskSpec, build_model, config_class
from urm_ray.models.urm import URMConfig

from guided import check_free_kl_trains_only_heads, head_calls, roll

TASK = TaskSpec(vocab_size=10, seq_len=12, num_puzzle_identifiers=3)
TINY = {"hidden_size": 32, "num_heads": 4, "num_layers": 1, "loops": 4, "truncation": 2,
        "puzzle_emb_dim": 32, "max_segments": 3, "latent_dim": 8}


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
    ours = roll(gram, batch)
    torch.manual_seed(1)
    for mine, theirs in zip(ours, roll(urm, batch)):
        for key in ("logits", "q_halt_logits", "q_continue_logits"):
            assert torch.equal(mine[key], theirs[key]), key


def test_every_loop_pass_is_a_guided_transition(model_batch):
    torch.manual_seed(0)
    model = build_model(GRAMURMConfig(**TINY), TASK)
    batch = model_batch(TASK)
    calls, outputs = head_calls(model.train(), batch)
    # 4 passes: the posterior guides each, the prior is charged at each, plus the Q-halt decode
    assert calls == {"posterior_head": 4, "prior_head": 5}
    assert outputs["kl"] > outputs["kl_first"] + outputs["kl_last"] > 0  # the middle passes count
    assert outputs["aux_loss"].requires_grad and "halt_logits" in outputs
    calls, outputs = head_calls(model.eval(), batch)
    assert calls == {"posterior_head": 0, "prior_head": 4} and "aux_loss" not in outputs
    assert not torch.equal(roll(model, batch, 1)[0]["logits"], roll(model, batch, 1)[0]["logits"])


def test_forward_only_passes_kl_trains_only_the_heads(model_batch):
    """Charging the truncated passes changes the heads' and label embedding's gradients only."""
    check_free_kl_trains_only_heads(
        lambda transitions: build_model(GRAMURMConfig(**{**TINY, "kl_transitions": transitions}), TASK),
        model_batch(TASK), "blocks.")
