"""TRM: config validation, paper size, and which cycles carry gradient.

The official-fixture replay for TRM is in test_models_official.py (shared with URM and HRM).
"""

import pytest
import torch

from urm_ray.errors import ConfigError
from urm_ray.models.layers import SwiGLU
from urm_ray.models.registry import TaskSpec, build_model
from urm_ray.models.trm import TRM, TRMConfig

from gradients import assert_matches_reference

TASK = TaskSpec(vocab_size=10, seq_len=12, num_puzzle_identifiers=3)
TINY = {"hidden_size": 32, "num_heads": 4, "num_layers": 1, "h_cycles": 3, "l_cycles": 2, "puzzle_emb_dim": 32,
        "puzzle_emb_len": 4, "max_segments": 3}


@pytest.mark.parametrize("key", ["num_layers", "h_cycles", "l_cycles"])
def test_invalid_config_names_the_key(key):
    with pytest.raises(ConfigError, match=f"model.{key}=0 must be >= 1"):
        TRMConfig(**{**TINY, key: 0})


def test_defaults_follow_the_paper():
    cfg = TRMConfig()
    assert (cfg.ffn, cfg.puzzle_emb_len, cfg.prefix_len, cfg.q_continue_target) == ("swiglu", 16, 16, False)
    model = build_model(cfg, TaskSpec(vocab_size=11, seq_len=81, num_puzzle_identifiers=2))
    assert isinstance(model.net.layers[0].mlp, SwiGLU)
    per_block = 4 * 512 * 512 + 3 * 512 * 1536
    count = sum(p.numel() for p in model.parameters())
    assert count == 2 * per_block + 2 * 11 * 512 + 2 * 512 + 2 == 6_828_034


def test_prefix_without_puzzle_embedding_is_zeros(model_batch):
    model = build_model(TRMConfig(**{**TINY, "puzzle_emb_dim": 0}), TASK)
    x = model.embed_input(model_batch(TASK)["inputs"], torch.zeros(2))
    assert x.shape == (2, 4 + TASK.seq_len, 32) and not x[:, :4].any()


def _reference_state(model: TRM, batch: dict) -> torch.Tensor:
    """The segment written out by hand: both states detached after every cycle but the last."""
    x = model.embed_input(batch["inputs"], batch["puzzle_identifiers"])
    rope = model.rotary_emb()
    z_H, z_L = model.init_z_H.expand_as(x), model.init_z_L.expand_as(x)
    for cycle in range(model.config.h_cycles):
        for _ in range(model.config.l_cycles):
            z_L = model.net(z_L, z_H + x, rope)
        z_H = model.net(z_H, z_L, rope)
        if cycle < model.config.h_cycles - 1:
            z_H, z_L = z_H.detach(), z_L.detach()
    return z_H


def test_only_the_last_cycle_carries_gradient(model_batch):
    torch.manual_seed(0)
    model = build_model(TRMConfig(**TINY), TASK).eval()
    batch = model_batch(TASK)
    assert_matches_reference(model, batch, _reference_state)


def test_q_continue_target_is_optional(model_batch):
    batch = model_batch(TASK)
    for flag in (False, True):
        model = build_model(TRMConfig(**{**TINY, "q_continue_target": flag}), TASK).train()
        _, outputs = model(model.initial_carry(batch), batch)
        assert ("target_q_continue" in outputs) == flag
