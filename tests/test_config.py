"""Config loading: presets, YAML files, dotted overrides, and errors that name the key."""

from pathlib import Path

import pytest
import yaml

from urm_ray.config import apply_overrides, build_config, flatten, load_config, preset_names, replace
from urm_ray.errors import ConfigError

BASE = {"model": {"name": "urm", "hidden_size": 32, "num_heads": 4, "loops": 4, "truncation": 1},
        "data": {"path": "somewhere"}}


def test_every_preset_parses_and_builds():
    names = preset_names()
    assert names, "no presets shipped"
    for name in names:
        cfg = load_config(name)
        assert cfg.model.name in {"urm", "hrm", "trm", "gram", "transformer"}


def test_overrides_change_typed_values():
    cfg = build_config(apply_overrides(BASE, ["model.loops=8", "optim.lr=3e-4", "train.bf16=false"]))
    assert cfg.model.loops == 8 and isinstance(cfg.model.loops, int)
    assert cfg.optim.lr == pytest.approx(3e-4)
    assert cfg.train.bf16 is False


def test_yaml_file_round_trip(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(BASE))
    cfg = load_config(str(path), ["train.steps=7"])
    assert cfg.train.steps == 7
    again = replace(cfg, [])
    assert flatten(again) == flatten(cfg)
    assert flatten(cfg)["model.loops"] == 4


@pytest.mark.parametrize(
    "override, words",
    [
        (["model.loopz=3"], ["model.loopz", "loops"]),
        (["trian.steps=3"], ["trian"]),
        (["model.loops=eight"], ["model.loops", "'eight'", "int"]),
        (["model.truncation=4"], ["model.truncation=4", "model.loops=4"]),
        (["train.global_batch_size=10", "train.num_workers=3"], ["global_batch_size=10", "num_workers=3"]),
        (["train.loss=mse"], ["train.loss", "stablemax"]),
        (["optim.lr=-1"], ["optim.lr=-1"]),
        (["model.name=gpt"], ["model.name", "urm"]),
        (["model.ffn=mlp"], ["model.ffn", "conv_swiglu"]),
        (["loops"], ["key=value"]),
    ],
)
def test_bad_values_name_the_key(override, words):
    with pytest.raises(ConfigError) as err:
        build_config(apply_overrides(BASE, override))
    for word in words:
        assert word in str(err.value)


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError, match="neither a YAML file nor a preset"):
        load_config("no-such-preset")


def test_bool_is_not_an_int():
    with pytest.raises(ConfigError, match="train.steps"):
        build_config(apply_overrides(BASE, ["train.steps=true"]))


def test_presets_name_known_builtin_datasets_whose_recipes_build(tmp_path, monkeypatch):
    from urm_ray.data import builtin
    from urm_ray.data.store import read_metadata
    from urm_ray.data.tasks.verify import verifier_for

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in preset_names():
        cfg = load_config(name)
        if cfg.data.path.startswith(builtin.PREFIX):
            assert cfg.data.path[len(builtin.PREFIX):] in builtin.RECIPES, name
        if getattr(cfg.model, "halt_target", "label") == "verifier":
            # the GRAM presets' data is small to build, and its task must have a verifier
            meta = read_metadata(builtin.resolve_path(cfg.data.path))
            verifier_for(meta.task, meta.seq_len)
