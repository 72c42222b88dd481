"""The memory plan of a step (urm_ray/train/memory.py, ``urm-ray plan``).

- The estimate counts what autograd keeps on fake tensors; a real step's backward graph, counted
  independently around ``train_step`` on the CPU (every family, bf16 autocast as on a GPU, with and
  without checkpointed blocks), keeps the same bytes within 10 %.
- Every shipped GPU preset and search space (its heaviest trial) fits the node type it targets
  in cluster/gpu.yaml at <= 90 % of its memory.
- ``urm-ray plan`` prints the peak and the largest micro-batch that fits, and exits 1 when the
  config does not fit, 2 on an unknown GPU.
"""

from __future__ import annotations

import pytest
import torch

import tiny
from urm_ray.cli import main
from urm_ray.config import load_config
from urm_ray.models.task import TaskSpec
from urm_ray.train.memory import FITS, GPUS, MIB, step_memory
from urm_ray.train.step import build_state, train_step
from urm_ray.tune.plan import heaviest, plan
from urm_ray.tune.space import load_space

ARC = TaskSpec(vocab_size=12, seq_len=900, num_puzzle_identifiers=800 * 1001 + 1)
SUDOKU = TaskSpec(vocab_size=11, seq_len=81, num_puzzle_identifiers=1)
MAZE = TaskSpec(vocab_size=6, seq_len=900, num_puzzle_identifiers=1)
# (preset or space, its dataset's shape, the smallest GPU of the node type it targets)
SHIPPED = [
    ("arc1-urm", ARC, "a100-40"),  # 8 workers: the 8x A100 40 GB on-demand node
    ("sudoku-extreme-1k-urm", SUDOKU, "a10g"),  # 1 worker: the 24 GB spot nodes (A10G, L4)
    ("maze30-urm", MAZE, "a10g"),
]
SPACES = [("urm-arc1", ARC, "a100-40"), ("urm-arc2", ARC, "a100-40"), ("urm-sudoku", SUDOKU, "a10g")]


def kept_by_a_real_step(cfg, rows: int) -> int:
    """Distinct storages autograd keeps in one real ``train_step`` (weights excluded)."""
    state = build_state(cfg, TaskSpec(6, 32, 5), torch.device("cpu"))
    weights = {t.untyped_storage().data_ptr() for t in [*state.model.parameters(), *state.model.buffers()]}
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    gen = torch.Generator().manual_seed(0)
    batch = {"inputs": torch.randint(1, 6, (rows, 32), generator=gen),
             "labels": torch.randint(1, 6, (rows, 32), generator=gen),
             "puzzle_identifiers": torch.randint(0, 5, (rows,), generator=gen)}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        train_step(state, batch)
    return sum(kept.values())


@pytest.mark.parametrize("family", sorted(tiny.FAMILIES))
@pytest.mark.parametrize(("checkpointed", "bf16_states"), [(False, False), (True, False), (False, True)])
def test_the_estimate_is_what_a_real_step_keeps(family: str, checkpointed: bool, bf16_states: bool):
    cfg = tiny.config(family, extra=("train.bf16=true", f"train.activation_checkpointing={str(checkpointed).lower()}",
                                     f"model.bf16_states={str(bf16_states).lower()}"))
    estimate = step_memory(cfg, TaskSpec(6, 32, 5)).saved(8)
    real = kept_by_a_real_step(cfg, 8)
    assert abs(estimate - real) <= 0.1 * real, (estimate, real)


def test_the_estimate_grows_with_rows_tokens_and_passes_with_gradients():
    cfg = load_config("sudoku4-urm", ["model.loops=4", "model.truncation=2"])
    base = step_memory(cfg, SUDOKU)
    assert base.saved(8) > base.saved(4) > 0 and base.state > 0 and base.carry_per_row > 0
    longer = step_memory(cfg, TaskSpec(11, 2 * 81, 1))
    assert 1.4 * base.saved_per_row < longer.saved_per_row < 2.2 * base.saved_per_row  # + per-row parts
    deeper = step_memory(load_config("sudoku4-urm", ["model.loops=4", "model.truncation=0"]), SUDOKU)
    assert 1.7 * base.saved_per_row < deeper.saved_per_row < 2.3 * base.saved_per_row  # 4 passes, not 2


def test_bf16_states_keep_a_fifth_less_of_arcs_step():
    """The carry, the norms' outputs and the convolution's output in bf16 (counted, not timed)."""
    plain = step_memory(load_config("arc1-urm"), ARC)
    bf16 = step_memory(load_config("arc1-urm", ["model.bf16_states=true"]), ARC)
    assert bf16.carry_per_row < plain.carry_per_row and bf16.state == plain.state
    assert bf16.saved_per_row + bf16.carry_per_row <= 0.8 * (plain.saved_per_row + plain.carry_per_row)


@pytest.mark.parametrize(("preset", "task", "gpu"), SHIPPED)
def test_every_shipped_gpu_preset_fits_its_node(preset: str, task: TaskSpec, gpu: str):
    the_plan = plan(load_config(preset), task, gpu)
    assert the_plan.cfg.resources.device in ("cuda", "auto")
    assert the_plan.fits, the_plan.render(preset)
    assert the_plan.memory.peak(the_plan.rows) <= FITS * GPUS[gpu] * MIB


@pytest.mark.parametrize(("space", "task", "gpu"), SPACES)
def test_every_shipped_gpu_space_fits_its_node_at_its_heaviest_trial(space: str, task: TaskSpec, gpu: str):
    loaded = load_space(space)
    cfg = heaviest(loaded)
    assert cfg.model.truncation == 0 and cfg.model.loops == 12  # loops high, none truncated
    the_plan = plan(cfg, task, gpu)
    assert the_plan.fits, the_plan.render(space)


def test_the_plan_command(capsys):
    shape = ["--gpu", "a100-40", "--seq-len", "900", "--vocab", "12", "--puzzles", "800801"]
    args = ["plan", "arc1-urm", *shape]
    with pytest.raises(SystemExit) as done:
        main(["plan", "arc1-urm", "train.micro_batch_size=0", *shape])  # 96 rows in one pass
    assert done.value.code == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "largest micro-batch that fits: 48 (train.micro_batch_size=48)" in out
    assert main(args) == 0 and " fits" in capsys.readouterr().out
    assert main(["plan", "arc1-urm", "--gpu", "v100", "--seq-len", "9", "--vocab", "3"]) == 2
    assert "--gpu 'v100': expected one of a10g, l4, a100-40, a100-80, h100" in capsys.readouterr().err
