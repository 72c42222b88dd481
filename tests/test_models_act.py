"""ACT wrapper: carry, halting in eval and train, exploration, Q-continue halting, DDP, registry."""

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils import _pytree as pytree

from urm_ray.errors import ConfigError
from urm_ray.models.act import ACTCarry
from urm_ray.models.registry import MODELS, TaskSpec, build_model, config_class
from urm_ray.models.urm import URM, URMConfig
from urm_ray.typed import from_dict

from ranks import run_ranks

TASK = TaskSpec(vocab_size=10, seq_len=8, num_puzzle_identifiers=3)


def _model(q_bias: tuple[float, float] = (-5.0, 0.0), **overrides) -> URM:
    cfg = {"hidden_size": 16, "num_heads": 2, "num_layers": 1, "loops": 2, "truncation": 1, "puzzle_emb_dim": 16,
           "max_segments": 4, "halt_exploration_prob": 0.0, **overrides}
    model = build_model(URMConfig(**cfg), TASK)
    with torch.no_grad():
        model.q_head.bias.copy_(torch.tensor(q_bias))
    return model


def _run(model: URM, batch: dict, calls: int) -> list[ACTCarry]:
    carry, carries = model.initial_carry(batch), []
    for _ in range(calls):
        carry, _ = model(carry, batch)
        carries.append(carry)
    return carries


def test_initial_carry_is_all_halted(model_batch):
    batch = model_batch(TASK, size=3)
    carry = _model().initial_carry(batch)
    assert carry.halted.all() and carry.segments.dtype == torch.int32 and not carry.segments.any()
    assert carry.state["hidden"].shape == (3, 1 + TASK.seq_len, 16)
    assert carry.current_data.keys() == batch.keys()


def test_eval_halts_only_at_the_segment_limit_then_restarts(model_batch):
    model = _model(q_bias=(5.0, -5.0)).eval()  # Q says halt, but eval ignores it
    carries = _run(model, model_batch(TASK), 5)
    assert [c.segments.tolist() for c in carries] == [[1, 1], [2, 2], [3, 3], [4, 4], [1, 1]]
    assert [c.halted.tolist() for c in carries] == [[False] * 2] * 3 + [[True] * 2, [False] * 2]
    assert all(not t.requires_grad for t in pytree.tree_leaves(carries[0]))


def test_train_halts_when_q_halt_is_positive(model_batch):
    batch = model_batch(TASK)
    assert _run(_model(q_bias=(5.0, 0.0)).train(), batch, 1)[0].halted.all()
    assert not _run(_model(q_bias=(-5.0, 0.0)).train(), batch, 1)[0].halted.any()


def test_exploration_delays_halting_to_at_least_two_segments(model_batch):
    torch.manual_seed(0)
    model = _model(q_bias=(5.0, 0.0), halt_exploration_prob=1.0, max_segments=8).train()
    carries = _run(model, model_batch(TASK, size=64), 1)
    assert not carries[0].halted.any()


def test_q_continue_target_halts_on_q_halt_above_q_continue(model_batch):
    batch = model_batch(TASK)
    model = _model(q_bias=(1.0, 2.0), q_continue_target=True).train()
    carry, outputs = model(model.initial_carry(batch), batch)
    assert not carry.halted.any() and outputs["target_q_continue"].shape == (2,)
    model = _model(q_bias=(2.0, 1.0), q_continue_target=True).train()
    assert model(model.initial_carry(batch), batch)[0].halted.all()
    single = _model(q_continue_target=True, max_segments=1).train()
    assert "target_q_continue" not in single(single.initial_carry(batch), batch)[1]


def test_carry_is_a_pytree_and_moves(model_batch):
    carry = _model().initial_carry(model_batch(TASK))
    leaves, spec = pytree.tree_flatten(carry)
    assert len(leaves) == 1 + 2 + 3
    rebuilt = pytree.tree_unflatten(leaves, spec)
    assert isinstance(rebuilt, ACTCarry) and rebuilt.state["hidden"] is carry.state["hidden"]
    moved = carry.to("cpu")
    assert moved is not carry and torch.equal(moved.segments, carry.segments)


def _grads_after_two_segments(model: URM, batch: dict) -> tuple[ACTCarry, dict[str, torch.Tensor]]:
    module = model.module if isinstance(model, DistributedDataParallel) else model
    carry = module.initial_carry(batch)
    for _ in range(2):
        carry, outputs = model(carry, batch)
        (outputs["logits"].sum() + outputs["q_halt_logits"].sum()).backward()
    return carry, {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


def _ddp_rank(rank: int, world_size: int) -> dict:
    torch.manual_seed(0)
    ddp = DistributedDataParallel(_model().train())
    carry, grads = _grads_after_two_segments(ddp, _batch(seed=rank))
    return {"steps": carry.segments.tolist(), "grads": grads,
            "local_grad": ddp.module.puzzle_emb.local_weights.grad is not None}


def _batch(seed: int, size: int = 2) -> dict:
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, TASK.vocab_size, (size, TASK.seq_len), generator=gen)
    ids = torch.randint(0, TASK.num_puzzle_identifiers, (size,), generator=gen)
    return {"inputs": inputs, "labels": inputs.clone(), "puzzle_identifiers": ids}


def test_distributed_data_parallel_averages_gradients_over_ranks(tmp_path):
    results = run_ranks(_ddp_rank, world_size=2, folder=tmp_path)
    local = []
    for rank in range(2):
        torch.manual_seed(0)
        local.append(_grads_after_two_segments(_model().train(), _batch(seed=rank))[1])
    assert "blocks.layers.0.mlp.down_proj.weight" in local[0]
    for result in results:
        assert result["steps"] == [2, 2] and result["local_grad"]
        assert result["grads"].keys() == local[0].keys()
        for name, grad in result["grads"].items():
            torch.testing.assert_close(grad, (local[0][name] + local[1][name]) / 2, msg=name)
    assert not torch.equal(local[0]["lm_head.weight"], local[1]["lm_head.weight"])  # ranks saw different data


def test_registry_builds_each_family():
    for name, (config_cls, model_cls) in MODELS.items():
        assert config_class(name) is config_cls
        cfg = from_dict(config_cls, {"name": name, "hidden_size": 16, "num_heads": 2, "puzzle_emb_dim": 0}, "model")
        assert type(build_model(cfg, TASK)) is model_cls
    with pytest.raises(ConfigError, match="model.name='gpt'"):
        config_class("gpt")
    with pytest.raises(ConfigError, match="unknown key model.loops"):
        from_dict(config_class("trm"), {"name": "trm", "loops": 3}, "model")
    with pytest.raises(ConfigError, match="task.seq_len=0"):
        TaskSpec(vocab_size=3, seq_len=0, num_puzzle_identifiers=1)
