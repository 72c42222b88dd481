"""Plain Transformer baseline: config, registry, one-pass forward, backward, and ACT wrapping."""

import pytest
import torch

from urm_ray.errors import ConfigError
from urm_ray.losses import act_loss
from urm_ray.models.layers import ConvSwiGLU, SwiGLU
from urm_ray.models.registry import TaskSpec, build_model, config_class
from urm_ray.models.transformer import Transformer, TransformerConfig

TASK = TaskSpec(vocab_size=10, seq_len=12, num_puzzle_identifiers=3)
TINY = {"hidden_size": 32, "num_heads": 4, "num_layers": 3, "puzzle_emb_dim": 32}


def test_registered_with_validated_config():
    assert config_class("transformer") is TransformerConfig
    assert isinstance(build_model(TransformerConfig(**TINY), TASK), Transformer)
    with pytest.raises(ConfigError, match="model.num_layers=0 must be >= 1"):
        TransformerConfig(**{**TINY, "num_layers": 0})


def test_defaults_and_size():
    cfg = TransformerConfig()
    assert (cfg.num_layers, cfg.max_segments, cfg.ffn) == (8, 1, "swiglu")
    model = build_model(cfg, TaskSpec(vocab_size=11, seq_len=81, num_puzzle_identifiers=2))
    per_block = 4 * 512 * 512 + 3 * 512 * 1536
    assert sum(p.numel() for p in model.parameters()) == 8 * per_block + 2 * 11 * 512 + 2 * 512 + 2


@pytest.mark.parametrize(("ffn", "mlp_type"), [("swiglu", SwiGLU), ("conv_swiglu", ConvSwiGLU)])
def test_one_segment_is_a_plain_forward_pass(model_batch, ffn, mlp_type):
    torch.manual_seed(0)
    model = build_model(TransformerConfig(**TINY, ffn=ffn), TASK).eval()
    assert all(type(layer.mlp) is mlp_type for layer in model.blocks.layers) and len(model.blocks.layers) == 3
    batch = model_batch(TASK)
    carry, outputs = model(model.initial_carry(batch), batch)
    assert carry.halted.all() and (carry.segments == 1).all()  # max_segments=1: done after one call
    x = model.embed_input(batch["inputs"], batch["puzzle_identifiers"])
    h = x
    for layer in model.blocks.layers:  # no state, no loop: blocks(x)
        h = layer(h, model.rope(x.shape[1]))
    torch.testing.assert_close(outputs["logits"], model.lm_head(h[:, model.prefix_len:]).float())


def test_backward_reaches_every_parameter(model_batch):
    model = build_model(TransformerConfig(**TINY), TASK).train()
    batch = model_batch(TASK)
    carry, outputs = model(model.initial_carry(batch), batch)
    loss, metrics = act_loss(outputs, carry.current_data["labels"], carry.halted, carry.segments)
    loss.backward()
    assert metrics["count"] == 2 and "kl" not in metrics
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    assert model.puzzle_emb.local_weights.grad is not None


def test_act_can_wrap_several_segments(model_batch):
    model = build_model(TransformerConfig(**TINY, max_segments=3), TASK).eval()
    batch = model_batch(TASK)
    carry = model.initial_carry(batch)
    logits = []
    for _ in range(3):
        carry, outputs = model(carry, batch)
        logits.append(outputs["logits"])
    assert carry.halted.all() and (carry.segments == 3).all()
    assert not torch.equal(logits[0], logits[1])  # later segments re-read the carried state


def test_is_urm_with_one_loop(model_batch):
    from urm_ray.models.urm import URM, URMConfig

    torch.manual_seed(0)
    transformer = build_model(TransformerConfig(**TINY), TASK).eval()
    torch.manual_seed(0)
    urm = build_model(URMConfig(**TINY, ffn="swiglu", loops=1, truncation=0), TASK).eval()
    assert isinstance(transformer, URM)
    with torch.no_grad():
        urm.init_hidden.zero_()  # the only difference: the baseline starts from zeros
    assert transformer.state_dict().keys() == urm.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(transformer.state_dict().values(),
                                                 urm.state_dict().values()))
    batch = model_batch(TASK)
    _, ours = transformer(transformer.initial_carry(batch), batch)
    _, theirs = urm(urm.initial_carry(batch), batch)
    torch.testing.assert_close(ours["logits"], theirs["logits"])
    with pytest.raises(ConfigError, match="model.loops=4: the transformer makes one pass"):
        TransformerConfig(**TINY, loops=4)
