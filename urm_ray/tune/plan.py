"""``urm-ray plan``: whether a config, or every trial of a search space, fits a GPU's memory.

    urm-ray plan arc1-urm --gpu a100-40 --seq-len 900 --vocab 12 --puzzles 800801
    urm-ray plan urm-sudoku --gpu a10g                  # a space: its heaviest trial

The step's memory is counted by ``train.memory`` for one worker (its share of the global batch).
A search space is planned at its heaviest corner (``heaviest``): every ``model.*`` integer at the
bound that keeps more block passes with gradients: ``model.truncation`` (passes without
gradients) at its low bound, every other at its high bound. The dataset's shape comes from its
metadata when ``data.path`` exists, else from ``--seq-len``, ``--vocab`` and ``--puzzles``.
"""

from __future__ import annotations

from dataclasses import dataclass

from urm_ray.config import RunConfig, overridden
from urm_ray.errors import ConfigError
from urm_ray.models.task import TaskSpec
from urm_ray.train.memory import FITS, GPUS, MIB, StepMemory, step_memory
from urm_ray.tune.space import SearchSpace

FEWER_IS_HEAVIER = frozenset({"model.truncation"})  # more passes without gradients: less kept
GIB = 1 << 30


@dataclass(frozen=True)
class Plan:
    cfg: RunConfig
    gpu: str
    memory: StepMemory

    @property
    def local_batch(self) -> int:
        return self.cfg.train.global_batch_size // self.cfg.resources.num_workers

    @property
    def rows(self) -> int:
        """Rows per forward/backward pass: the micro-batch, or the worker's whole share."""
        return self.cfg.train.micro_batch_size or self.local_batch

    @property
    def fits(self) -> bool:
        return self.memory.fits(self.rows, GPUS[self.gpu])

    def render(self, name: str) -> str:
        gib = GPUS[self.gpu] * MIB / GIB
        m, train = self.memory, self.cfg.train
        lines = [
            f"{name} on {self.gpu} ({gib:.1f} GiB; fits at <= {FITS:.0%}): {self.local_batch} rows per "
            f"worker per step, {self.rows} per pass, activation checkpointing "
            f"{'on' if train.activation_checkpointing else 'off'}",
            f"  weights, gradients, optimizer state, EMA, buffers  {m.state / GIB:8.2f} GiB",
            f"  kept for backward and ACT carry, per row          {m.per_row / MIB:8.1f} MiB",
            f"  estimated peak                                      {m.peak(self.rows) / GIB:8.2f} GiB  "
            f"{'fits' if self.fits else 'DOES NOT FIT'}",
        ]
        largest = m.largest_micro_batch(GPUS[self.gpu], self.local_batch)
        lines.append(f"  largest micro-batch that fits: {largest} (train.micro_batch_size={largest})" if largest
                     else "  no micro-batch fits: try train.activation_checkpointing=true or more workers")
        return "\n".join(lines)


def check_gpu(gpu: str) -> str:
    if gpu not in GPUS:
        raise ConfigError(f"--gpu {gpu!r}: expected one of {', '.join(GPUS)}")
    return gpu


def plan(cfg: RunConfig, task: TaskSpec, gpu: str) -> Plan:
    return Plan(cfg, check_gpu(gpu), step_memory(cfg, task))


def heaviest(space: SearchSpace) -> RunConfig:
    """The space's base config at the corner that needs the most memory per step."""
    values: dict[str, float] = {}
    for param in space.params:
        if param.key.startswith("model.") and param.kind.endswith("int"):
            low, high = param.bounds(space.env(values))
            values[param.key] = low if param.key in FEWER_IS_HEAVIER else high
    return overridden(space.base_config, [f"{key}={int(value)}" for key, value in values.items()])


def task_shape(cfg: RunConfig, seq_len: int, vocab: int, puzzles: int) -> TaskSpec:
    """The dataset's shape: from the command line where given, else from its metadata."""
    if seq_len and vocab:
        return TaskSpec(vocab, seq_len, max(puzzles, 1))
    from urm_ray.data import builtin, stream

    try:
        data = overridden(cfg, [f"data.path={builtin.resolve_path(cfg.data.path)}"]).data
        meta = stream.load_meta(data)
        return TaskSpec(meta.vocab_size, meta.seq_len, stream.puzzle_table_size(meta, data))
    except (ConfigError, ValueError) as err:
        raise ConfigError(f"the dataset's shape: {err}; or give --seq-len, --vocab (and --puzzles, "
                          "the puzzle-embedding rows) to plan without the data") from None
