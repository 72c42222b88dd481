"""What a model family is to the rest of urm_ray: the model protocol that the training loop,
evaluation and test-time compute call, and the spec the registry keeps for each family.

    spec = family("gram_urm")                       # urm_ray.models.registry
    spec.samples, spec.has_loops, spec.state_noise  # what it can do, said by the spec, never probed
    with spec.running_with(model, TestTime(segments=24, loops=12)):
        ...                                         # the model runs deeper; its config is untouched

Callers outside ``urm_ray/models/`` ask the spec; they do not test a model or its config for
attributes (tests/test_models_family.py greps the package for such probes).

Test-time settings never write into the model's config object: a family's model reads its
config (``config.loops``, ``config.state_noise``) and ``max_segments`` at every call, so
``running_with`` hands the model a copy of its config that holds the settings and gives the
original object back on exit. That object is the run config's ``model`` section during training,
which must not change under an in-run evaluation. Width needs no hook: the N trajectories of a
puzzle are N rows of one batch, and rows never see each other.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Optional, Protocol

from torch import Tensor, nn

from urm_ray.models.act import ACTCarry, Batch
from urm_ray.models.layers import PuzzleEmbedding
from urm_ray.models.task import TaskSpec

ObjectiveKind = Literal["act", "guided"]


class ReasoningModel(Protocol):
    """What the loop, evaluation and test-time compute use of a model, any family."""

    config: Any  # the family's config dataclass (FamilySpec.config)
    task: TaskSpec
    max_segments: int  # ACT segment limit; evaluation runs exactly this many
    puzzle_emb: Optional[PuzzleEmbedding]  # None where model.puzzle_emb_dim = 0
    training: bool

    @property
    def stack_passes(self) -> int:
        """Block-stack passes per ACT segment: the unit of test-time compute."""

    def initial_carry(self, batch: Batch) -> ACTCarry: ...

    def schedule(self, step: int) -> None: ...

    def __call__(self, carry: ACTCarry, batch: Batch) -> tuple[ACTCarry, dict[str, Tensor]]: ...


class SamplingModel(ReasoningModel, Protocol):
    """A family that draws its trajectories from a learned prior (``FamilySpec.samples``)."""

    noise_scale: float
    sample_temperature: float  # the prior's standard deviation times this, in eval mode
    sample_halt: Literal["limit", "q"]


@dataclass(frozen=True)
class TestTime:
    """Settings a trained model runs with at evaluation; 0 / None = as trained."""

    __test__ = False  # not a pytest class, despite its name

    segments: int = 0  # ACT segments
    loops: int = 0  # block-stack passes per segment (families with loops)
    noise: float = 0.0  # std of the Gaussian noise on the recurrent state (families with state noise)
    temperature: Optional[float] = None  # the prior's sampling temperature (families that sample)


@dataclass(frozen=True)
class FamilySpec:
    """One model family: its config and model classes, the objective it trains with, and what it
    can do at test time."""

    name: str  # model.name
    config: type
    model: type[nn.Module]
    objective: ObjectiveKind = "act"  # guided: the variational objective of a model with guidance
    samples: bool = False  # draws trajectories from a prior: sample_temperature, sample_halt
    has_loops: bool = False  # config.loops passes of one stack per segment, config.truncation of them no-grad
    state_noise: bool = False  # takes Gaussian noise on its recurrent state (config.state_noise)

    def build(self, config: Any, task: TaskSpec) -> nn.Module:
        """A freshly initialised model of this family."""
        return self.model(config, task)

    def sample_temperature(self, model: nn.Module) -> Optional[float]:
        """The temperature ``model`` samples at; None for a family that does not sample."""
        return model.sample_temperature if self.samples else None

    def sample_halt(self, model: nn.Module) -> str:
        """Where a prior sample of ``model`` stops: ``limit`` (the ACT limit) or ``q`` (its halt
        head); ``limit`` for a family that does not sample."""
        return model.sample_halt if self.samples else "limit"

    def config_at(self, config: Any, settings: TestTime) -> Any:
        """``config`` as the model reads it under ``settings``: the same object where they change
        nothing, else a copy that holds them (the original is never written)."""
        changes: dict[str, Any] = {}
        if self.has_loops and settings.loops:
            changes["loops"] = settings.loops
        if self.state_noise:
            changes["state_noise"] = settings.noise
        if all(getattr(config, key) == value for key, value in changes.items()):
            return config
        moved = copy.copy(config)  # a flat dataclass of plain values: a shallow copy is a full one
        vars(moved).update(changes)
        return moved

    @contextmanager
    def running_with(self, model: nn.Module, settings: TestTime) -> Iterator[nn.Module]:
        """``model`` running with ``settings``: its config object swapped for one that holds them
        and its segment limit and sampling temperature set; on exit the model holds exactly what it
        held before (the same config object, never written)."""
        saved: dict[str, Any] = {"config": model.config, "max_segments": model.max_segments}
        now: dict[str, Any] = {"config": self.config_at(model.config, settings),
                               "max_segments": settings.segments or model.max_segments}
        if self.samples:
            saved["sample_temperature"] = model.sample_temperature
            now["sample_temperature"] = (model.sample_temperature if settings.temperature is None
                                         else settings.temperature)
        for key, value in now.items():
            setattr(model, key, value)
        try:
            yield model
        finally:
            for key, value in saved.items():
                setattr(model, key, value)
