"""URM: config validation, ablation fields, paper size, truncated backprop through loops (TBPTL).

The official-fixture replay for URM is in test_models_official.py (shared with TRM and HRM).
"""

import pytest
import torch

from urm_ray.errors import ConfigError
from urm_ray.models.layers import ConvSwiGLU, SwiGLU, ffn_width
from urm_ray.models.registry import TaskSpec, build_model
from urm_ray.models.urm import URM, URMConfig

TASK = TaskSpec(vocab_size=10, seq_len=12, num_puzzle_identifiers=3)
TINY = {"hidden_size": 32, "num_heads": 4, "num_layers": 2, "puzzle_emb_dim": 32, "max_segments": 4}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"loops": 4, "truncation": 4}, "model.truncation=4 must be >= 0 and < model.loops=4"),
        ({"truncation": -1}, "model.truncation=-1"),
        ({"hidden_size": 30, "num_heads": 4}, "model.hidden_size=30 must be divisible by model.num_heads=4"),
        ({"hidden_size": 36, "num_heads": 12}, "even head dimension"),
        ({"num_layers": 0}, "model.num_layers=0"),
        ({"max_segments": 0}, "model.max_segments=0"),
        ({"halt_exploration_prob": 1.5}, "model.halt_exploration_prob=1.5"),
        ({"puzzle_emb_dim": 100, "puzzle_emb_len": 1}, "model.puzzle_emb_len=1"),
        ({"conv_kernel": 0}, "model.conv_kernel=0"),
    ],
)
def test_invalid_config_names_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        URMConfig(**{**TINY, **overrides})


def test_conv_settings_without_conv_warn():
    with pytest.warns(UserWarning, match="model.conv_kernel"):
        URMConfig(ffn="swiglu", conv_kernel=3)


@pytest.mark.parametrize(
    ("overrides", "mlp_type", "conv_shape"),
    [
        ({}, ConvSwiGLU, (256, 1, 2)),
        ({"conv_kernel": 3}, ConvSwiGLU, (256, 1, 3)),
        ({"conv_position": "before_gate"}, ConvSwiGLU, (512, 1, 2)),
        ({"ffn": "swiglu"}, SwiGLU, None),
    ],
)
def test_ffn_ablations_are_config_fields(overrides, mlp_type, conv_shape, model_batch):
    model = build_model(URMConfig(**{**TINY, **overrides}), TASK)
    mlp = model.blocks.layers[0].mlp
    assert type(mlp) is mlp_type
    assert (mlp.dwconv.weight.shape if conv_shape else None) == conv_shape
    batch = model_batch(TASK)
    _, outputs = model(model.initial_carry(batch), batch)
    assert outputs["logits"].shape == (2, TASK.seq_len, TASK.vocab_size)


def test_prefix_length_defaults_to_ceil_of_puzzle_dim():
    assert URMConfig(hidden_size=64, num_heads=4, puzzle_emb_dim=80).prefix_len == 2
    assert URMConfig(hidden_size=64, num_heads=4, puzzle_emb_dim=0).prefix_len == 0
    model = build_model(URMConfig(**{**TINY, "puzzle_emb_dim": 0}), TASK)
    assert model.puzzle_emb is None
    assert model.empty_state(2, torch.device("cpu"))["hidden"].shape == (2, TASK.seq_len, 32)


def test_paper_size_builds_and_counts_parameters():
    cfg = URMConfig()  # 4 layers, hidden 512, 8 heads, M=8 loops, N=2 truncated, 16 segments
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.loops, cfg.truncation, cfg.max_segments) == (
        4, 512, 8, 8, 2, 16
    )
    task = TaskSpec(vocab_size=11, seq_len=81, num_puzzle_identifiers=2)  # Sudoku-sized
    model = build_model(cfg, task)
    width = ffn_width(512, 4.0)
    per_block = 4 * 512 * 512 + 3 * 512 * width + 2 * width + width  # attn, MLP, depthwise conv
    expected = 4 * per_block + 2 * 11 * 512 + 2 * 512 + 2
    count = sum(p.numel() for p in model.parameters())
    assert width == 1536 and count == expected == 13_662_210
    batch = {"inputs": torch.zeros(1, 81, dtype=torch.int32), "labels": torch.zeros(1, 81, dtype=torch.long),
             "puzzle_identifiers": torch.zeros(1, dtype=torch.int32)}
    with torch.no_grad():
        _, outputs = model.eval()(model.initial_carry(batch), batch)
    assert outputs["logits"].shape == (1, 81, 11)


def _reference_loss(model: URM, batch: dict, truncation: int, probe: torch.Tensor) -> torch.Tensor:
    """One segment written out by hand: the first `truncation` loop outputs are detached."""
    x = model.embed_input(batch["inputs"], batch["puzzle_identifiers"])
    h = model.init_hidden.expand_as(x)
    for loop in range(model.config.loops):
        h = model.blocks(h, x, model.rotary_emb())
        if loop < truncation:
            h = h.detach()
    logits = model.lm_head(h[:, model.prefix_len :])
    return (logits * probe).sum() + model.q_head(h[:, 0]).sum()


def _grads(model: URM, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _segment_loss(model: URM, batch: dict, probe: torch.Tensor) -> torch.Tensor:
    _, outputs = model(model.initial_carry(batch), batch)
    return (outputs["logits"] * probe).sum() + outputs["q_halt_logits"].sum() + outputs["q_continue_logits"].sum()


def test_truncation_matches_explicitly_detached_reference(model_batch):
    torch.manual_seed(0)
    model = build_model(URMConfig(**{**TINY, "loops": 5, "truncation": 3}), TASK).eval()
    batch = model_batch(TASK)
    probe = torch.randn(2, TASK.seq_len, TASK.vocab_size)
    ours = _grads(model, _segment_loss(model, batch, probe))
    reference = _grads(model, _reference_loss(model, batch, 3, probe))
    assert ours.keys() == reference.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], reference[name], rtol=1e-4, atol=1e-6, msg=name)

    untruncated = build_model(URMConfig(**{**TINY, "loops": 5, "truncation": 0}), TASK).eval()
    untruncated.load_state_dict(model.state_dict())
    full = _grads(untruncated, _segment_loss(untruncated, batch, probe))
    full_reference = _grads(model, _reference_loss(model, batch, 0, probe))
    key = "blocks.layers.0.mlp.down_proj.weight"
    torch.testing.assert_close(full[key], full_reference[key], rtol=1e-4, atol=1e-6)
    assert not torch.allclose(full[key], ours[key])
