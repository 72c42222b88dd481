"""HRM: config validation, paper size, the one-step gradient and the Q-continue target.

The official-fixture replay for HRM (including target_q_continue) is in test_models_official.py.
"""

import pytest
import torch

from urm_ray.errors import ConfigError
from urm_ray.models.hrm import HRM, HRMConfig
from urm_ray.models.registry import TaskSpec, build_model

from gradients import assert_matches_reference

TASK = TaskSpec(vocab_size=10, seq_len=12, num_puzzle_identifiers=3)
TINY = {"hidden_size": 32, "num_heads": 4, "h_layers": 1, "l_layers": 2, "h_cycles": 3, "l_cycles": 2,
        "puzzle_emb_dim": 32, "max_segments": 3}


@pytest.mark.parametrize("key", ["h_layers", "l_layers", "h_cycles", "l_cycles"])
def test_invalid_config_names_the_key(key):
    with pytest.raises(ConfigError, match=f"model.{key}=0 must be >= 1"):
        HRMConfig(**{**TINY, key: 0})


def test_paper_size_parameter_count():
    cfg = HRMConfig()
    assert (cfg.h_layers, cfg.l_layers, cfg.h_cycles, cfg.l_cycles, cfg.q_continue_target) == (4, 4, 2, 2, True)
    model = build_model(cfg, TaskSpec(vocab_size=11, seq_len=81, num_puzzle_identifiers=2))
    per_block = 4 * 512 * 512 + 3 * 512 * 1536
    count = sum(p.numel() for p in model.parameters())
    assert count == 8 * per_block + 2 * 11 * 512 + 2 * 512 + 2 == 27_275_266


def _reference_state(model: HRM, batch: dict) -> torch.Tensor:
    """The full update schedule by hand; states detached before the final L and H updates."""
    x = model.embed_input(batch["inputs"], batch["puzzle_identifiers"])
    rope = model.rotary_emb()
    z_H, z_L = model.init_z_H.expand_as(x), model.init_z_L.expand_as(x)
    schedule = (["L"] * model.config.l_cycles + ["H"]) * model.config.h_cycles
    for step, level in enumerate(schedule):
        if step == len(schedule) - 2:
            z_H, z_L = z_H.detach(), z_L.detach()
        if level == "L":
            z_L = model.L_level(z_L, z_H + x, rope)
        else:
            z_H = model.H_level(z_H, z_L, rope)
    return z_H


def test_one_step_gradient_matches_explicit_schedule(model_batch):
    torch.manual_seed(0)
    model = build_model(HRMConfig(**TINY), TASK).eval()
    batch = model_batch(TASK)
    assert_matches_reference(model, batch, _reference_state)


def test_target_q_continue_bootstraps_from_the_next_segment(model_batch):
    torch.manual_seed(0)
    model = build_model(HRMConfig(**TINY), TASK)
    with torch.no_grad():
        model.q_head.weight.normal_(0, 0.1)
    batch = model_batch(TASK)
    carry = model.initial_carry(batch)
    for _ in range(model.config.max_segments):
        model.train()
        carry, outputs = model(carry, batch)
        model.eval()
        with torch.no_grad():
            restart = carry.halted.clone()
            carry.halted = torch.zeros_like(restart)  # peek at the next segment without resetting
            _, nxt = model(carry, batch)
            carry.halted = restart
        last = carry.segments >= model.config.max_segments
        best = torch.where(last, nxt["q_halt_logits"], nxt["q_halt_logits"].maximum(nxt["q_continue_logits"]))
        torch.testing.assert_close(outputs["target_q_continue"], torch.sigmoid(best))
        assert not outputs["target_q_continue"].requires_grad
    model.eval()
    _, outputs = model(model.initial_carry(batch), batch)
    assert "target_q_continue" not in outputs
