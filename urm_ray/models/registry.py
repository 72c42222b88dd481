"""Model families by name: ``model.name`` -> (config class, model class), and the task shape.

    task = TaskSpec(vocab_size=11, seq_len=81, num_puzzle_identifiers=1)
    model = build_model(URMConfig(loops=8, truncation=2), task)
"""

from __future__ import annotations

from torch import nn

from urm_ray.errors import ConfigError
from urm_ray.models.gram import GRAM, GRAMConfig
from urm_ray.models.gram_urm import GRAMURM, GRAMURMConfig
from urm_ray.models.hrm import HRM, HRMConfig
from urm_ray.models.task import TaskSpec
from urm_ray.models.transformer import Transformer, TransformerConfig
from urm_ray.models.trm import TRM, TRMConfig
from urm_ray.models.urm import URM, URMConfig


MODELS: dict[str, tuple[type, type[nn.Module]]] = {
    "urm": (URMConfig, URM),
    "trm": (TRMConfig, TRM),
    "hrm": (HRMConfig, HRM),
    "gram": (GRAMConfig, GRAM),
    "gram_urm": (GRAMURMConfig, GRAMURM),
    "transformer": (TransformerConfig, Transformer),
}


def config_class(name: str) -> type:
    """The config dataclass registered for ``model.name``."""
    if name not in MODELS:
        raise ConfigError(f"model.name={name!r}: expected one of {sorted(MODELS)}")
    return MODELS[name][0]


def build_model(config: object, task: TaskSpec) -> nn.Module:
    """A freshly initialised model of the family named by ``config.name``."""
    name = getattr(config, "name", None)
    config_cls = config_class(name)
    if not isinstance(config, config_cls):
        raise ConfigError(f"model.name={name!r} needs a {config_cls.__name__}, got {type(config).__name__}")
    return MODELS[name][1](config, task)
