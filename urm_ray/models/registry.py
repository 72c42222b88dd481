"""Model families by name: ``model.name`` -> its ``FamilySpec`` (config class, model class,
objective, capabilities), and the task shape.

    task = TaskSpec(vocab_size=11, seq_len=81, num_puzzle_identifiers=1)
    model = build_model(URMConfig(loops=8, truncation=2), task)
    family_of(model).has_loops          # True: what callers ask instead of probing the model
"""

from __future__ import annotations

from torch import nn

from urm_ray.errors import ConfigError
from urm_ray.models.family import FamilySpec, ReasoningModel
from urm_ray.models.gram import GRAM, GRAMConfig
from urm_ray.models.gram_urm import GRAMURM, GRAMURMConfig
from urm_ray.models.hrm import HRM, HRMConfig
from urm_ray.models.task import TaskSpec
from urm_ray.models.transformer import Transformer, TransformerConfig
from urm_ray.models.trm import TRM, TRMConfig
from urm_ray.models.urm import URM, URMConfig


FAMILIES: dict[str, FamilySpec] = {spec.name: spec for spec in (
    FamilySpec("urm", URMConfig, URM, has_loops=True, state_noise=True),
    FamilySpec("trm", TRMConfig, TRM, state_noise=True),
    FamilySpec("hrm", HRMConfig, HRM, state_noise=True),
    FamilySpec("gram", GRAMConfig, GRAM, objective="guided", samples=True),
    FamilySpec("gram_urm", GRAMURMConfig, GRAMURM, objective="guided", samples=True, has_loops=True),
    # one pass per segment by construction (model.loops must be 1): looping it is model.name=urm
    FamilySpec("transformer", TransformerConfig, Transformer, state_noise=True),
)}

MODELS: dict[str, tuple[type, type[nn.Module]]] = {name: (s.config, s.model) for name, s in FAMILIES.items()}


def family(name: str) -> FamilySpec:
    """The spec registered for ``model.name``."""
    if name not in FAMILIES:
        raise ConfigError(f"model.name={name!r}: expected one of {sorted(FAMILIES)}")
    return FAMILIES[name]


def family_of(model: ReasoningModel) -> FamilySpec:
    """The spec of a built model's family."""
    return family(model.config.name)


def config_class(name: str) -> type:
    """The config dataclass registered for ``model.name``."""
    return family(name).config


def build_model(config: object, task: TaskSpec) -> nn.Module:
    """A freshly initialised model of the family named by ``config.name``."""
    name = getattr(config, "name", None)
    spec = family(name)
    if not isinstance(config, spec.config):
        raise ConfigError(f"model.name={name!r} needs a {spec.config.__name__}, got {type(config).__name__}")
    return spec.build(config, task)
