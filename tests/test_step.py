"""The training step's gradient accumulation and activation checkpointing, on every family.

- ``train.micro_batch_size``: the worker's rows go through forward and backward in micro-batches
  and one optimizer step; weights, metrics and the carried state equal one batch's within float32
  rounding (the sums run in another order: not bit for bit), GRAM's with its noise off (its draws
  are per micro-batch, as they are per worker).
- ``train.activation_checkpointing``: the same step as without (the recomputation repeats the
  random draws), with fewer bytes kept for backward.
- ``model.bf16_states``: under bf16 autocast the carried states are bf16, and two segments' loss
  and gradients stay within bf16's error of float32 without autocast: the loss within 2^-7, the
  gradients at most twice as far as autocast's float32 stream already takes them.
"""

from __future__ import annotations

import pytest
import torch

import tiny
from urm_ray.errors import ConfigError
from urm_ray.objectives import objective_for
from urm_ray.train.memory import saved_bytes
from urm_ray.train.step import build_state, micro_batches, to_device, train_step

NOISELESS = {"gram": ["model.noise_scale=0"], "gram_urm": ["model.noise_scale=0"]}


def batches(count: int, rows: int = 8, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    task = tiny.TASK
    return [{"inputs": torch.randint(1, task.vocab_size, (rows, task.seq_len), generator=gen),
             "labels": torch.randint(1, task.vocab_size, (rows, task.seq_len), generator=gen),
             "puzzle_identifiers": torch.randint(0, task.num_puzzle_identifiers, (rows,), generator=gen)}
            for _ in range(count)]


def trained(family: str, extra: list[str], steps: int = 2):
    state = build_state(tiny.config(family, extra=(*NOISELESS.get(family, []), *extra)), tiny.TASK,
                        torch.device("cpu"))
    metrics = [train_step(state, batch) for batch in batches(steps)]
    return state, metrics


def assert_same_step(a, b, atol: float) -> None:
    (state_a, metrics_a), (state_b, metrics_b) = a, b
    for (name, x), y in zip(state_a.model.state_dict().items(), state_b.model.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=0, atol=atol, msg=name)
    for step_a, step_b in zip(metrics_a, metrics_b, strict=True):
        assert step_a.keys() == step_b.keys()
        for key in step_a:
            torch.testing.assert_close(step_a[key], step_b[key], rtol=1e-6, atol=atol * 10, msg=key)
    leaves_a = torch.utils._pytree.tree_leaves(state_a.carry)
    for x, y in zip(leaves_a, torch.utils._pytree.tree_leaves(state_b.carry), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=atol * 10)


@pytest.mark.parametrize("family", sorted(tiny.FAMILIES))
def test_micro_batches_make_the_step_of_one_batch(family: str):
    initial = build_state(tiny.config(family, extra=tuple(NOISELESS.get(family, []))), tiny.TASK,
                          torch.device("cpu")).model.state_dict()
    whole, split = trained(family, []), trained(family, ["train.micro_batch_size=4"])
    assert micro_batches(whole[0]) == 1 and micro_batches(split[0]) == 2
    assert_same_step(whole, split, atol=1e-6)
    moved = [(p - q).abs().max() for p, q in zip(whole[0].model.state_dict().values(), initial.values())
             if p.is_floating_point()]
    assert max(moved) > 1e-4  # the steps trained: equal weights are not the untouched init


def test_gram_trains_in_micro_batches_with_its_noise():
    state, metrics = trained("gram", ["model.noise_scale=1.0", "train.micro_batch_size=4"])
    assert all(not bool(m["nonfinite"]) for m in metrics) and "kl" in metrics[-1]
    assert torch.utils._pytree.tree_leaves(state.carry)[0].shape[0] == 8  # the rows joined again


def test_a_micro_batch_must_divide_the_workers_rows():
    with pytest.raises(ConfigError, match=r"train.micro_batch_size=3 must be 0 .* = 8"):
        tiny.config("urm", extra=("train.micro_batch_size=3",))
    with pytest.raises(ConfigError, match=r"train.micro_batch_size=4 .* = 2"):
        tiny.config("urm", extra=("resources.num_workers=4", "train.micro_batch_size=4"))


@pytest.mark.parametrize("family", sorted(tiny.FAMILIES))
def test_checkpointed_blocks_make_the_same_step_and_keep_less(family: str):
    plain, checkpointed = trained(family, [], 1), trained(family, ["train.activation_checkpointing=true"], 1)
    assert_same_step(plain, checkpointed, atol=1e-6)
    kept = [saved_bytes(state.cfg, state.model, tiny.TASK, 8) for state, _ in (plain, checkpointed)]
    assert kept[1] < 0.75 * kept[0], kept


def test_fractional_gpus_are_refused_for_several_workers():
    with pytest.raises(ConfigError, match=r"resources.gpus_per_worker=0.5 with resources.num_workers=2: DDP's NCCL"):
        tiny.config("urm", extra=("resources.num_workers=2", "resources.gpus_per_worker=0.5", "resources.device=cuda"))
    assert tiny.config("urm", extra=("resources.gpus_per_worker=0.5", "resources.device=cuda")).resources.gpus_per_worker == 0.5


def test_a_batch_reaches_the_device_unchanged():
    batch = batches(1)[0]
    moved = to_device(batch, torch.device("cpu"))
    assert moved.keys() == batch.keys() and all(torch.equal(moved[k], batch[k]) for k in batch)


def loss_and_gradients(family: str, bf16_states: bool, autocast: bool):
    """Two segments of a fresh model (the second from the first's carry) and their loss's gradients."""
    cfg = tiny.config(family, extra=(f"model.bf16_states={str(bf16_states).lower()}",))
    model = build_state(cfg, tiny.TASK, torch.device("cpu")).model
    batch = batches(1)[0]
    torch.manual_seed(0)  # the same halting exploration and GRAM noise in every variant
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        carry = model.initial_carry(batch)
        for _ in range(2):
            carry, outputs = model(carry, batch)
        loss = objective_for(cfg)(outputs, carry)[0]
    loss.backward()
    gradients = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
    return float(loss.detach()), gradients, carry


@pytest.mark.parametrize("family", sorted(tiny.FAMILIES))
def test_bf16_states_stay_within_bf16_error_of_float32(family: str):
    loss, gradients, carry = loss_and_gradients(family, bf16_states=False, autocast=False)
    assert all(v.dtype == torch.float32 for v in carry.state.values())
    _, autocast_gradients, _ = loss_and_gradients(family, bf16_states=False, autocast=True)
    bf16_loss, bf16_gradients, bf16_carry = loss_and_gradients(family, bf16_states=True, autocast=True)
    assert all(v.dtype == torch.bfloat16 for v in bf16_carry.state.values())
    assert abs(bf16_loss - loss) <= 2**-7 * abs(loss), (bf16_loss, loss)
    error = lambda g: float((g - gradients).norm() / gradients.norm())  # noqa: E731
    assert 0 < error(bf16_gradients) <= 2 * error(autocast_gradients) + 1e-3, (
        error(bf16_gradients), error(autocast_gradients))
