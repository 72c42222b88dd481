"""Convert between urm_ray models and the official URM / TRM / HRM configs and checkpoints.

    state_dict = torch.load(path, weights_only=True)    # an official state dict, read as data
    model = load_official("urm", ckpt_config, state_dict)  # official config dict + state dict
    state_dict = export_official(model)                    # keys "inner.<official name>"
    config = official_config(model, batch_size=768)        # the official arch config dict

Official checkpoints store the ACT wrapper's keys (``inner.…``), usually behind the
``_orig_mod.model.`` prefix of torch.compile and the loss head; both prefixes are accepted.
Loading is strict: unknown config keys, missing or unexpected tensors and shape mismatches raise
``ConfigError`` naming the key. Exporting a model the official code cannot express (e.g. a URM
truncation that is not (H_cycles - 1) * L_cycles of H_cycles * L_cycles loops) raises too.
"""

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from torch import Tensor

from urm_ray.errors import ConfigError
from urm_ray.models.hrm import HRMConfig
from urm_ray.models.recurrent import RecurrentConfig, RecurrentModel, require
from urm_ray.models.registry import build_model
from urm_ray.models.task import TaskSpec
from urm_ray.models.trm import TRMConfig
from urm_ray.models.urm import URMConfig
from urm_ray.typed import from_dict

_REQUIRED = object()
_WRAPPER_PREFIXES = ("_orig_mod.", "model.")  # torch.compile, then the official ACTLossHead
# Official keys that describe batching, dtype placement or the training recipe, not the weights.
_IGNORED_KEYS = ("batch_size", "forward_dtype", "name", "loss")


class _Reader:
    """Reads an official config dict, remembering which keys were used to reject the rest."""

    def __init__(self, arch: str, config: Mapping[str, Any]) -> None:
        self.arch, self.config, self.used = arch, dict(config), set(_IGNORED_KEYS)

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        self.used.add(key)
        if key in self.config:
            return self.config[key]
        if default is _REQUIRED:
            raise ConfigError(f"official {self.arch} config: missing key {key!r}")
        return default

    def check_all_used(self) -> None:
        unknown = sorted(set(self.config) - self.used)
        if unknown:
            raise ConfigError(f"official {self.arch} config: unknown key {unknown[0]!r}")


def _read_common(r: _Reader) -> dict[str, Any]:
    """Fields every family shares, with the official defaults where the official key is optional."""
    pos = r.get("pos_encodings")
    require(pos == "rope", f"official {r.arch} config: pos_encodings={pos!r}, only 'rope' is supported")
    return {
        "hidden_size": r.get("hidden_size"),
        "num_heads": r.get("num_heads"),
        "expansion": r.get("expansion"),
        "puzzle_emb_dim": r.get("puzzle_emb_ndim", 0),
        "rope_theta": r.get("rope_theta", 10000.0),
        "rms_norm_eps": r.get("rms_norm_eps", 1e-5),
    }


def _read_urm(r: _Reader) -> dict[str, Any]:
    for key in ("attn_dropout", "mlp_dropout"):
        if r.get(key, 0.0):
            warnings.warn(f"official urm config: {key}={r.config[key]} is unused by the official model too")
    h_cycles, l_cycles = r.get("H_cycles"), r.get("L_cycles")
    return {"num_layers": r.get("num_layers"), "max_segments": r.get("loops"),
            "loops": h_cycles * l_cycles, "truncation": (h_cycles - 1) * l_cycles}


def _read_trm(r: _Reader) -> dict[str, Any]:
    require(not r.get("mlp_t", False), "official trm config: mlp_t=True (MLP token mixing) is not supported")
    r.get("H_layers", 0)  # the official TRM ignores it: one network serves both levels
    return {"num_layers": r.get("L_layers"), "h_cycles": r.get("H_cycles"), "l_cycles": r.get("L_cycles"),
            "max_segments": r.get("halt_max_steps"), "halt_exploration_prob": r.get("halt_exploration_prob"),
            "puzzle_emb_len": r.get("puzzle_emb_len", 16),
            "q_continue_target": not r.get("no_ACT_continue", True)}


def _read_hrm(r: _Reader) -> dict[str, Any]:
    return {"h_layers": r.get("H_layers"), "l_layers": r.get("L_layers"), "h_cycles": r.get("H_cycles"),
            "l_cycles": r.get("L_cycles"), "max_segments": r.get("halt_max_steps"),
            "halt_exploration_prob": r.get("halt_exploration_prob")}


def _write_urm(cfg: URMConfig) -> dict[str, Any]:
    with_grad = cfg.loops - cfg.truncation
    require(
        cfg.loops % with_grad == 0,
        f"model.loops={cfg.loops} with model.truncation={cfg.truncation} has no official URM form: "
        f"it runs H_cycles*L_cycles loops with the first (H_cycles-1)*L_cycles forward-only, so "
        f"loops must be a multiple of loops - truncation",
    )
    return {"num_layers": cfg.num_layers, "loops": cfg.max_segments,
            "H_cycles": cfg.loops // with_grad, "L_cycles": with_grad}


def _write_trm(cfg: TRMConfig) -> dict[str, Any]:
    require(cfg.puzzle_emb_dim > 0 or cfg.prefix_len == 0,
            f"model.puzzle_emb_len={cfg.puzzle_emb_len} without a puzzle embedding has no official TRM form")
    return {"H_layers": 0, "L_layers": cfg.num_layers, "H_cycles": cfg.h_cycles, "L_cycles": cfg.l_cycles,
            "halt_max_steps": cfg.max_segments, "halt_exploration_prob": cfg.halt_exploration_prob,
            "puzzle_emb_len": cfg.prefix_len, "mlp_t": False, "no_ACT_continue": not cfg.q_continue_target}


def _write_hrm(cfg: HRMConfig) -> dict[str, Any]:
    return {"H_layers": cfg.h_layers, "L_layers": cfg.l_layers, "H_cycles": cfg.h_cycles,
            "L_cycles": cfg.l_cycles, "halt_max_steps": cfg.max_segments,
            "halt_exploration_prob": cfg.halt_exploration_prob}


@dataclass(frozen=True)
class _Layout:
    """How one family maps onto its official config and state-dict names."""

    config_cls: type[RecurrentConfig]
    read: Callable[[_Reader], dict[str, Any]]
    write: Callable[[Any], dict[str, Any]]
    fixed: dict[str, Any]  # our fields the official model hard-codes (they change the forward pass)
    fixed_training: dict[str, Any]  # same, but only training differs: exported with a warning
    renames: tuple[tuple[str, str], ...]  # (our key prefix, official key prefix after "inner.")


_COMMON_RENAMES = (("embed_tokens.weight", "embed_tokens.embedding_weight"),)
_SWIGLU = {"ffn": "swiglu"}
_CONV = {"ffn": "conv_swiglu", "conv_kernel": 2, "conv_position": "after_gate"}
_LAYOUTS = {
    "urm": _Layout(URMConfig, _read_urm, _write_urm, {**_CONV, "puzzle_emb_len": 0},
                   {"halt_exploration_prob": 0.1, "q_continue_target": False},
                   _COMMON_RENAMES + (("blocks.layers.", "layers."),)),
    "trm": _Layout(TRMConfig, _read_trm, _write_trm, _SWIGLU, {},
                   _COMMON_RENAMES + (("init_z_H", "H_init"), ("init_z_L", "L_init"), ("net.", "L_level."))),
    "hrm": _Layout(HRMConfig, _read_hrm, _write_hrm, {**_SWIGLU, "puzzle_emb_len": 0},
                   {"q_continue_target": True},
                   _COMMON_RENAMES + (("init_z_H", "H_init"), ("init_z_L", "L_init"))),
}


def _layout(arch: str) -> _Layout:
    if arch not in _LAYOUTS:
        raise ConfigError(f"arch={arch!r}: expected one of {sorted(_LAYOUTS)}")
    return _LAYOUTS[arch]


def config_from_official(arch: str, config: Mapping[str, Any]) -> tuple[RecurrentConfig, TaskSpec]:
    """Our model config and task shape from an official arch config dict (official key names)."""
    layout, reader = _layout(arch), _Reader(arch, config)
    fields = {**_read_common(reader), **layout.read(reader), **layout.fixed, **layout.fixed_training}
    task = TaskSpec(reader.get("vocab_size"), reader.get("seq_len"), reader.get("num_puzzle_identifiers"))
    reader.check_all_used()
    return from_dict(layout.config_cls, {"name": arch, **fields}, "model"), task


def official_config(model: RecurrentModel, batch_size: int | None = None) -> dict[str, Any]:
    """The official arch config dict that rebuilds ``model`` (``batch_size`` added when given)."""
    cfg, task = model.config, model.task
    layout = _layout(cfg.name)
    fixed = dict(layout.fixed)
    if "puzzle_emb_len" in fixed:  # the official prefix is always ceil(dim / hidden)
        del fixed["puzzle_emb_len"]
        require(cfg.prefix_len == math.ceil(cfg.puzzle_emb_dim / cfg.hidden_size),
                f"model.puzzle_emb_len={cfg.puzzle_emb_len} has no official {cfg.name} form "
                f"(always ceil(puzzle_emb_dim / hidden_size) positions)")
    for key, value in fixed.items():
        require(getattr(cfg, key) == value,
                f"model.{key}={getattr(cfg, key)!r} has no official {cfg.name} form (always {value!r})")
    for key, value in layout.fixed_training.items():
        if getattr(cfg, key) != value:
            warnings.warn(f"model.{key}={getattr(cfg, key)!r}: the official {cfg.name} trains with {value!r}")
    out = {"vocab_size": task.vocab_size, "seq_len": task.seq_len,
           "num_puzzle_identifiers": task.num_puzzle_identifiers, "hidden_size": cfg.hidden_size,
           "num_heads": cfg.num_heads, "expansion": cfg.expansion, "puzzle_emb_ndim": cfg.puzzle_emb_dim,
           "pos_encodings": "rope", "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_norm_eps,
           **layout.write(cfg)}
    return out if batch_size is None else {"batch_size": batch_size, **out}


def _rename(key: str, renames: tuple[tuple[str, str], ...], reverse: bool = False) -> str:
    for ours, official in renames:
        src, dst = (official, ours) if reverse else (ours, official)
        if key.startswith(src):
            return dst + key[len(src):]
    return key


def _our_key(arch: str, key: str) -> str:
    """Official (possibly wrapped) state-dict key -> our key."""
    for prefix in _WRAPPER_PREFIXES:
        key = key.removeprefix(prefix)
    if not key.startswith("inner."):
        raise ConfigError(f"official {arch} state dict: unexpected key {key!r} (expected 'inner.…')")
    return _rename(key.removeprefix("inner."), _layout(arch).renames, reverse=True)


def official_key(arch: str, our_key: str) -> str:
    """Our state-dict key -> the official one (``inner.…``)."""
    return "inner." + _rename(our_key, _layout(arch).renames)


def _check_state_dict(arch: str, model: RecurrentModel, ours: dict[str, Tensor]) -> None:
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(ours)), sorted(set(ours) - set(expected))
    if missing:
        raise ConfigError(f"official {arch} state dict: missing key {official_key(arch, missing[0])!r}")
    if unexpected:
        raise ConfigError(f"official {arch} state dict: unexpected key {official_key(arch, unexpected[0])!r}")
    for key, value in ours.items():
        if value.shape != expected[key].shape:
            raise ConfigError(
                f"official {arch} state dict: {official_key(arch, key)!r} has shape {tuple(value.shape)}, "
                f"the config implies {tuple(expected[key].shape)}"
            )


def load_official(arch: str, config: Mapping[str, Any], state_dict: Mapping[str, Tensor]) -> RecurrentModel:
    """Build our model from an official config dict and load an official state dict into it."""
    model_cfg, task = config_from_official(arch, config)
    model = build_model(model_cfg, task)
    ours = {_our_key(arch, key): value for key, value in state_dict.items()}
    _check_state_dict(arch, model, ours)
    model.load_state_dict(ours)
    return model


def export_official(model: RecurrentModel) -> dict[str, Tensor]:
    """The model's parameters and persistent buffers under the official ``inner.…`` names."""
    official_config(model)  # raises if the official code cannot express this model
    arch = model.config.name
    return {official_key(arch, key): value for key, value in model.state_dict().items()}
