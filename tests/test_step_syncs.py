"""The training step never waits for the device (tests/syncs.py records what would make it), for
every family; the only host work a step may do is a task hook the config asks for, one copy each.
The compiled step is checked in tests/test_compiled.py, next to its graph counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from urm_ray.data.store import DatasetMeta
from urm_ray.eval.heldout import evaluate_batch, evaluate_sampled
from urm_ray.objectives import objective_for
from urm_ray.train.step import TrainState, evaluation_model, train_step

from syncs import HostSyncs
from tiny import FAMILIES, TASK, batch, config, trainer


def steps_syncs(state: TrainState, first: int = 1, steps: int = 2) -> HostSyncs:
    """What ``steps`` training steps from batch ``first`` on waited for (after a first step that
    created the optimizer state)."""
    if state.position.step == 0:
        train_step(state, batch(0))
    torch.manual_seed(first)
    with HostSyncs() as syncs:
        for step in range(first, first + steps):
            metrics = train_step(state, batch(step))
    assert all(value.device == state.device and value.dim() == 0 for value in metrics.values())
    return syncs


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_training_step_waits_for_nothing(family: str):
    tiny = trainer(family, False)
    syncs = steps_syncs(tiny)
    assert not syncs.seen, syncs.report()
    if family == "urm":  # the sign-SGD table was trained, without a sync
        assert tiny.model.puzzle_emb.weights.abs().sum() > 0


def test_evaluation_at_the_segment_limit_waits_for_nothing():
    """The held-out rollout and GRAM's sampling at the limit run max_segments segments without
    asking the device whether every row has halted."""
    tiny = trainer("gram", False)
    with evaluation_model(tiny) as model, HostSyncs() as syncs:
        sums = evaluate_batch(model, batch(0))
        sampled = evaluate_sampled(model, batch(1), 3)
    assert not syncs.seen, syncs.report()
    assert sums["segments"] == sampled["segments"] == 8 * model.max_segments


# sudoku 4x4: a verifier and a nearest search (all 288 boards), numpy and scipy on the host
SUDOKU = DatasetMeta(task="sudoku", vocab_size=TASK.vocab_size, seq_len=TASK.seq_len,
                     num_puzzle_identifiers=TASK.num_puzzle_identifiers, augmentation="sudoku")
HOOKS = {  # config -> host copies per step (hooks x segments: one segment per step)
    ("model.halt_target=verifier",): 1,
    ("model.prior_match=1.0",): 1,
    ("model.prior_match=1.0", "model.prior_match_targets=nearest", "model.halt_target=verifier"): 2,
    ("train.label_targets=nearest",): 1,
}


@pytest.mark.parametrize("extra", list(HOOKS), ids=lambda extra: ",".join(e.split(".", 1)[1] for e in extra))
def test_a_task_hook_is_the_steps_only_host_work_one_copy_each(extra: tuple[str, ...]):
    cfg = config("gram", extra=extra)
    tiny = trainer("gram", False, extra, objective_for(cfg, SUDOKU))
    syncs = steps_syncs(tiny, steps=1)
    copies = [seen for seen in syncs.seen if seen.startswith("Tensor.")]
    assert len(copies) == HOOKS[extra] * 2, syncs.report()  # each hook: .cpu() then .numpy()
    assert all("objectives.py" in seen for seen in syncs.seen), syncs.report()


def test_the_recorder_sees_every_kind_of_sync():
    """The recorder itself: each of these would wait for a GPU, and each is seen, with where it
    came from."""
    x = torch.tensor([0.0, 2.0, 0.0, 3.0])
    mask = x > 0
    with HostSyncs() as syncs:
        x.sum().item(), bool(x.any()), int(x[0]), x.tolist(), x.numpy(), x.cpu(), x.to("cpu")
        x.nonzero(), x.unique(), x[mask], x.masked_select(mask), x.repeat_interleave(torch.tensor([1, 2, 1, 0]))
        x[mask] = 1.0
        np.sort(np.arange(3))
    kinds = [seen.split(" at ")[0] for seen in syncs.seen]
    expected = ["Tensor.item", "aten._local_scalar_dense.default", "Tensor.__bool__",
                "Tensor.__int__", "aten._local_scalar_dense.default", "Tensor.tolist", "Tensor.numpy",
                "Tensor.cpu", "Tensor.to", "aten.nonzero.default", "aten._unique2.default", "aten.index.Tensor",
                "aten.masked_select.default", "aten.repeat_interleave.Tensor", "aten.index_put_.default"]
    for kind in expected:
        assert kind in kinds, (kind, kinds)
    assert any(kind.startswith("numpy.") for kind in kinds)
    with HostSyncs() as syncs:
        x.sort(stable=True), x.cumsum(0), x.index_add(0, torch.tensor([0, 0, 1, 1]), x), x[torch.tensor([1, 1])]
    assert not syncs.seen, syncs.report()  # what the sync-free code uses instead


def test_the_recorder_around_compiled_code_sees_reads_and_syncs_inside_it():
    @torch.compile(backend="eager", dynamic=False)
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * x.sum().item()

    x = torch.ones(3)
    scaled(x)
    with HostSyncs(compiled=True) as syncs:
        scaled(x), x.tolist(), x.numpy(), x.cpu(), x.sum().item()
    kinds = [seen.split(" at ")[0] for seen in syncs.seen]
    item = ["Tensor.item", "aten._local_scalar_dense.default"]  # the one in scaled: a graph break, run eagerly
    assert kinds == [*item, "Tensor.tolist", "Tensor.numpy", "Tensor.cpu", *item], kinds


def test_the_recorder_names_where_a_sync_came_from():
    from urm_ray.losses import matched_answers

    rows = torch.tensor([[1, 2], [1, 2], [3, 4]])
    with HostSyncs() as syncs:
        matched_answers(rows, torch.zeros_like(rows), rows)
    assert syncs.seen and all("losses.py" in seen and "matched_answers" in seen for seen in syncs.seen)
