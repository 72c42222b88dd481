"""Replay the official URM / TRM / HRM fixtures through load_official: outputs, carry, loss, grads."""

from typing import Any

import pytest
import torch

from urm_ray.errors import ConfigError
from urm_ray.losses import stablemax_cross_entropy
from urm_ray.models.hrm import HRMConfig
from urm_ray.models.official import export_official, load_official, official_config, official_key
from urm_ray.models.registry import TaskSpec, build_model
from urm_ray.models.trm import TRMConfig
from urm_ray.models.urm import URMConfig

TOL = {"rtol": 1e-4, "atol": 1e-4}
FIXTURE_STATE_NAMES = {"hidden": "current_hidden"}  # our state name -> the fixture's carry key


@pytest.fixture(params=["urm", "trm", "hrm"])
def reference(request: pytest.FixtureRequest, reference_dir) -> dict[str, Any]:
    return torch.load(reference_dir / request.param / "fixture.pt", weights_only=True)


def _load(reference: dict[str, Any], state_dict: dict | None = None):
    arch = reference["meta"]["model"]
    return arch, load_official(arch, reference["config"], state_dict or reference["state_dict"])


def _assert_outputs(outputs: dict, carry, expected: dict) -> None:
    for key in ("logits", "q_halt_logits", "q_continue_logits"):
        torch.testing.assert_close(outputs[key], expected[key], **TOL)
    assert torch.equal(carry.halted, expected["halted"])
    assert torch.equal(carry.segments, expected["steps"])
    for name, value in carry.state.items():
        torch.testing.assert_close(value, expected["carry"][FIXTURE_STATE_NAMES.get(name, name)], **TOL)


def _lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    per_token = stablemax_cross_entropy(logits, labels)  # [B, L] float64
    return (per_token / (labels != -100).sum(-1, keepdim=True).clamp_min(1)).sum()


def test_eval_rollout_matches_every_act_step(reference):
    _, model = _load(reference)
    model.eval()
    batch = reference["batch"]
    with torch.no_grad():
        carry = model.initial_carry(batch)
        for expected in reference["steps"]:
            carry, outputs = model(carry, batch)
            _assert_outputs(outputs, carry, expected)
    assert carry.halted.all()


def test_partial_reset_restarts_only_halted_rows(reference):
    _, model = _load(reference)
    model.eval()
    batch, expected = reference["batch"], reference["partial_reset"]
    with torch.no_grad():
        carry = model.initial_carry(batch)
        for _ in range(expected["n_calls_before"]):
            carry, _ = model(carry, batch)
        carry.halted = expected["halted_in"].clone()
        carry, outputs = model(carry, expected["batch2"])
    _assert_outputs(outputs, carry, expected)
    for key, value in expected["current_data"].items():
        assert torch.equal(carry.current_data[key], value)


def test_train_step_loss_and_gradients(reference):
    arch, model = _load(reference)
    model.train()
    batch, expected = reference["batch"], reference["train"]
    carry, outputs = model(model.initial_carry(batch), batch)
    for key in ("logits", "q_halt_logits", "q_continue_logits"):
        torch.testing.assert_close(outputs[key], expected[key], **TOL)
    assert ("target_q_continue" in outputs) == ("target_q_continue" in expected)
    if "target_q_continue" in expected:
        torch.testing.assert_close(outputs["target_q_continue"], expected["target_q_continue"], **TOL)
    loss = _lm_loss(outputs["logits"], batch["labels"])
    assert loss.item() == pytest.approx(reference["loss"], rel=1e-5)
    loss.backward()
    for name, param in model.named_parameters():
        key = official_key(arch, name)
        if key in reference["params_without_grad"]:
            assert param.grad is None, key  # the q head gets no gradient from the LM loss
        else:
            torch.testing.assert_close(param.grad, reference["grads"][key], **TOL, msg=key)
    assert set(reference["grads"]) | set(reference["params_without_grad"]) == {
        official_key(arch, n) for n, _ in model.named_parameters()
    }


def test_puzzle_embedding_gradient(reference):
    _, model = _load(reference)
    model.train()
    batch, grads = reference["batch"], reference["buffer_grads"]
    _, outputs = model(model.initial_carry(batch), batch)
    _lm_loss(outputs["logits"], batch["labels"]).backward()
    emb = model.puzzle_emb
    torch.testing.assert_close(emb.local_weights.grad, grads["inner.puzzle_emb.local_weights"], **TOL)
    table_grad = torch.zeros_like(emb.weights).index_add_(0, emb.local_ids, emb.local_weights.grad)
    torch.testing.assert_close(table_grad, grads["inner.puzzle_emb.weights"], **TOL)
    assert emb.weights.grad is None


def test_export_gives_back_the_official_state_dict_and_config(reference):
    _, model = _load(reference)
    exported = export_official(model)
    assert exported.keys() == reference["state_dict"].keys()
    for key, value in reference["state_dict"].items():
        assert torch.equal(exported[key], value), key
    fixture_config = {k: v for k, v in reference["config"].items() if k != "forward_dtype"}
    assert official_config(model, batch_size=reference["config"]["batch_size"]) == fixture_config


@pytest.mark.parametrize("prefix", ["_orig_mod.model.", "model."])
def test_checkpoint_prefixes_are_accepted(reference, prefix):
    wrapped = {prefix + key: value for key, value in reference["state_dict"].items()}
    _, model = _load(reference, wrapped)
    assert torch.equal(model.lm_head.weight, reference["state_dict"]["inner.lm_head.weight"])


def test_strict_state_dict_errors_name_the_key(reference):
    arch = reference["meta"]["model"]
    state = dict(reference["state_dict"])
    with pytest.raises(ConfigError, match="missing key 'inner.lm_head.weight'"):
        load_official(arch, reference["config"], {k: v for k, v in state.items() if k != "inner.lm_head.weight"})
    with pytest.raises(ConfigError, match="unexpected key 'inner.extra.weight'"):
        load_official(arch, reference["config"], {**state, "inner.extra.weight": torch.zeros(1)})
    with pytest.raises(ConfigError, match="inner.q_head.bias.*shape"):
        load_official(arch, reference["config"], {**state, "inner.q_head.bias": torch.zeros(3)})
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        load_official(arch, {**reference["config"], "bogus": 1}, state)
    with pytest.raises(ConfigError, match="missing key 'hidden_size'"):
        load_official(arch, {k: v for k, v in reference["config"].items() if k != "hidden_size"}, state)


ROUND_TRIP_CONFIGS = {
    "urm-no-puzzle": URMConfig(hidden_size=64, num_heads=4, num_layers=3, loops=6, truncation=4,
                               puzzle_emb_dim=0, max_segments=5),
    "urm-2-prefix": URMConfig(hidden_size=64, num_heads=4, num_layers=3, loops=6, truncation=4,
                              puzzle_emb_dim=80, max_segments=5),
    "trm": TRMConfig(hidden_size=64, num_heads=2, num_layers=1, h_cycles=2, l_cycles=3, puzzle_emb_dim=80,
                     puzzle_emb_len=4, max_segments=3, q_continue_target=True),
    "hrm": HRMConfig(hidden_size=64, num_heads=4, h_layers=2, l_layers=1, h_cycles=3, l_cycles=1,
                     puzzle_emb_dim=0, max_segments=2),
}


@pytest.mark.parametrize("name", sorted(ROUND_TRIP_CONFIGS))
def test_export_then_load_round_trips_other_sizes(name):
    cfg = ROUND_TRIP_CONFIGS[name]
    task = TaskSpec(vocab_size=7, seq_len=9, num_puzzle_identifiers=4)
    model = build_model(cfg, task).eval()
    loaded = load_official(cfg.name, official_config(model), export_official(model)).eval()
    assert loaded.config == cfg and loaded.task == task
    for (key, value), (key2, value2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert key == key2 and torch.equal(value, value2)
    batch = {"inputs": torch.randint(0, 7, (2, 9)), "labels": torch.randint(0, 7, (2, 9)),
             "puzzle_identifiers": torch.tensor([0, 3])}
    with torch.no_grad():
        _, out = model(model.initial_carry(batch), batch)
        _, out2 = loaded(loaded.initial_carry(batch), batch)
    assert torch.equal(out["logits"], out2["logits"])


def test_urm_official_mapping_of_cycles():
    model = build_model(ROUND_TRIP_CONFIGS["urm-2-prefix"], TaskSpec(7, 9, 4))
    official = official_config(model)
    assert (official["H_cycles"], official["L_cycles"], official["loops"]) == (3, 2, 5)
    state = export_official(model)
    assert state["inner.puzzle_emb.weights"].shape == (4, 80)
    assert "inner.layers.2.mlp.dwconv.weight" in state and "inner.init_hidden" in state


def test_urm_export_without_official_form_raises():
    model = build_model(URMConfig(hidden_size=32, num_heads=4, loops=8, truncation=2), TaskSpec(7, 9, 4))
    with pytest.raises(ConfigError, match="model.loops=8 with model.truncation=2"):
        export_official(model)
    model = build_model(URMConfig(hidden_size=32, num_heads=4, ffn="swiglu"), TaskSpec(7, 9, 4))
    with pytest.raises(ConfigError, match="model.ffn='swiglu'"):
        official_config(model)
