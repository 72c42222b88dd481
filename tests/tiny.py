"""Tiny training states of every family, for the tests of the training step and of checkpoints."""

from __future__ import annotations

import torch

from urm_ray.config import RunConfig, load_config
from urm_ray.models.registry import TaskSpec
from urm_ray.objectives import Objective
from urm_ray.train.step import TrainState, build_state

TASK = TaskSpec(vocab_size=6, seq_len=16, num_puzzle_identifiers=5)
SMALL = ["model.hidden_size=32", "model.num_heads=2", "model.expansion=1.0", "train.global_batch_size=8",
         "optim.warmup_steps=0", "model.halt_exploration_prob=0.5"]
# every family, with the puzzle embedding on where the family's preset has it off
FAMILIES = {
    "urm": ["model.loops=3", "model.truncation=1", "model.puzzle_emb_dim=32"],
    "hrm": ["model.h_layers=1", "model.l_layers=1", "model.h_cycles=2", "model.l_cycles=2"],
    "trm": ["model.num_layers=1", "model.h_cycles=2", "model.l_cycles=2"],
    "gram": ["model.num_layers=1", "model.latent_dim=8"],
    "gram_urm": ["model.num_layers=1", "model.loops=3", "model.latent_dim=8"],
    "transformer": ["model.num_layers=2", "model.max_segments=2"],
}
# a tiny URM run on a 4x4 Sudoku dataset: one worker thread, no evaluation, one warmup step
RUN = ["model.hidden_size=16", "model.num_heads=2", "model.num_layers=1", "model.loops=2",
       "model.truncation=1", "model.max_segments=2", "model.expansion=1.0", "resources.torch_threads=1",
       "train.global_batch_size=8", "eval.every=0", "eval.max_rows=8", "optim.warmup_steps=1"]


def run_config(data, tmp_path, experiment: str, *overrides: str) -> RunConfig:
    """``RUN`` on the dataset at ``data``, its runs and SQLite MLflow store under ``tmp_path``."""
    return load_config("sudoku4-urm", [
        *RUN, f"data.path={data}", f"checkpoint.storage_path={tmp_path / 'runs'}",
        f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", f"tracking.experiment={experiment}",
        *overrides])


def config(family: str, compiled: bool = False, extra: tuple[str, ...] = ()) -> RunConfig:
    overrides = [*SMALL, *FAMILIES[family], f"train.compile={str(compiled).lower()}", *extra]
    return load_config(f"sudoku4-{family.replace('_', '-')}", overrides)


def trainer(family: str, compiled: bool, extra: tuple[str, ...] = (),
            objective: Objective | None = None) -> TrainState:
    return build_state(config(family, compiled, extra), TASK, torch.device("cpu"), objective=objective)


def batch(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, TASK.vocab_size, (8, TASK.seq_len), generator=gen, dtype=torch.int32)
    labels = torch.where(torch.rand(8, TASK.seq_len, generator=gen) < 0.2, -100, inputs.long())
    ids = torch.randint(0, TASK.num_puzzle_identifiers, (8,), generator=gen, dtype=torch.int32)
    return {"inputs": inputs, "labels": labels, "puzzle_identifiers": ids}
