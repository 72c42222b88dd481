"""Config loading: presets, YAML files, dotted overrides, errors that name the key, and warnings
for keys that have no effect (never from a shipped preset or search space)."""

import re
import warnings
from pathlib import Path

import pytest
import yaml

from urm_ray.config import (
    RENAMED,
    apply_overrides,
    build_config,
    flatten,
    load_config,
    overridden,
    preset_names,
    renamed,
    with_values,
)
from urm_ray.data.config import DataConfig
from urm_ray.errors import ConfigError
from urm_ray.models.registry import MODELS
from urm_ray.tune.space import load_space, shipped_spaces

BASE = {"model": {"name": "urm", "hidden_size": 32, "num_heads": 4, "loops": 4, "truncation": 1},
        "data": {"path": "somewhere"}}


def test_every_preset_parses_and_builds():
    names = preset_names()
    assert names, "no presets shipped"
    for name in names:
        cfg = load_config(name)
        assert cfg.model.name in MODELS


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
    again = overridden(cfg, [])
    assert flatten(again) == flatten(cfg)
    assert flatten(cfg)["model.loops"] == 4


@pytest.mark.parametrize(
    "override, words",
    [
        (["model.loopz=3"], ["model.loopz", "loops"]),
        (["trian.steps=3"], ["trian"]),
        (["model.loops=eight"], ["model.loops", "'eight'", "int"]),
        (["model.truncation=4"], ["model.truncation=4", "model.loops=4"]),
        (["train.global_batch_size=10", "resources.num_workers=3"], ["global_batch_size=10", "num_workers=3"]),
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


@pytest.mark.parametrize(
    "override, hint",
    [
        (["train.stpes=3"], "(did you mean train.steps?)"),
        (["model.lops=3"], "(did you mean model.loops?)"),
        (["optim.weight_decy=0.1"], "(did you mean optim.weight_decay?)"),
        (["trian.steps=3"], "(did you mean train?)"),
    ],
)
def test_a_mistyped_key_suggests_the_close_one(override, hint):
    with pytest.raises(ConfigError) as err:
        build_config(apply_overrides(BASE, override))
    assert hint in str(err.value)


def test_an_unlike_key_suggests_nothing():
    with pytest.raises(ConfigError) as err:
        build_config(apply_overrides(BASE, ["train.qqqqqq=3"]))
    assert "did you mean" not in str(err.value) and "valid keys here" in str(err.value)


def test_a_mistyped_preset_or_space_suggests_the_close_one():
    with pytest.raises(ConfigError, match=r"'sudoku4-urn' is neither .* \(did you mean sudoku4-urm\?\)"):
        load_config("sudoku4-urn")
    with pytest.raises(ConfigError, match=r"'quickstrat' not found \(did you mean quickstart\?\)"):
        load_space("quickstrat")
    with pytest.raises(ConfigError, match=r"quickstart.trails \(did you mean quickstart.trials\?\)"):
        load_space("quickstart", ["trails=3"])  # a sweep's own key among its overrides


def test_a_mistyped_searched_parameter_suggests_the_config_key(tmp_path: Path):
    space = {"base": "sudoku4-urm", "params": {"model.lops": {"type": "int", "low": 2, "high": 4}},
             "objectives": [{"metric": "eval/exact_accuracy", "mode": "max"}], "trials": 2}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    with pytest.raises(ConfigError, match=r"parameter model.lops: unknown config key \(did you mean model.loops\?\)"):
        load_space(str(path))


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


# --- keys that have no effect in a configuration warn, naming the key and why -----------------


def _quiet(build):
    """Runs `build` with every warning an error: none of the "no effect" warnings may fire."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return build()


@pytest.mark.parametrize("override, words", [
    ("optim.puzzle_emb_lr=1.0e-4", "optim.puzzle_emb_lr=0.0001 has no effect with model.puzzle_emb_dim=0"),
    ("optim.puzzle_emb_weight_decay=1.0", "optim.puzzle_emb_weight_decay=1.0 has no effect"),
    ("model.halt_exploration_prob=0.3", "model.halt_exploration_prob=0.3 has no effect with model.max_segments=1"),
    ("data.translate=true", "data.translate=true has no effect with data.augment=false"),
    ("model.bf16_states=true", "model.bf16_states=true has no effect with train.bf16=false"),
])
def test_keys_without_effect_warn(override, words):
    base = ["model.puzzle_emb_dim=0", "model.max_segments=1", "data.augment=false",
            "data.num_augmentations=1", "train.bf16=false"]
    _quiet(lambda: build_config(apply_overrides(BASE, base)))  # defaults alone are quiet
    with pytest.warns(UserWarning, match=re.escape(words)):
        build_config(apply_overrides(BASE, [*base, override]))


def test_keys_with_effect_do_not_warn():
    _quiet(lambda: build_config(apply_overrides(BASE, [
        "model.puzzle_emb_dim=32", "optim.puzzle_emb_lr=1.0e-4", "optim.puzzle_emb_weight_decay=1.0",
        "model.max_segments=2", "model.halt_exploration_prob=0.3", "data.translate=true",
        "model.bf16_states=true"])))
    # exploration switched off, or left at the family's default, with one segment
    _quiet(lambda: build_config(apply_overrides(BASE, ["model.max_segments=1",
                                                       "model.halt_exploration_prob=0"])))
    _quiet(lambda: load_config("sudoku4-transformer"))
    with pytest.warns(UserWarning, match="halt_exploration_prob=0.1 has no effect"):
        load_config("sudoku4-transformer", ["model.halt_exploration_prob=0.1"])


def test_gpu_keys_warn_when_the_run_trains_on_cpu():
    for native_bf16 in (True, False):  # auto bf16 (GPU only), default GPU share
        _quiet(lambda: load_config("sudoku4-urm").warn_unused_on_cpu(native_bf16))
        _quiet(lambda: load_config("sudoku4-urm", ["train.bf16=false"]).warn_unused_on_cpu(native_bf16))
    with pytest.warns(UserWarning, match="resources.gpus_per_worker=0.5 has no effect: the run trains on CPU"):
        load_config("sudoku4-urm", ["resources.gpus_per_worker=0.5"]).warn_unused_on_cpu(True)
    _quiet(lambda: load_config("sudoku4-urm", ["train.bf16=true"]).warn_unused_on_cpu(True))
    with pytest.warns(UserWarning, match="train.bf16=true on a CPU without native bf16"):
        load_config("sudoku4-urm", ["train.bf16=true"]).warn_unused_on_cpu(False)


def test_translate_warns_on_data_that_is_not_arc():
    from urm_ray.data import stream
    from urm_ray.data.store import DatasetMeta

    sudoku = DatasetMeta(task="sudoku", vocab_size=6, seq_len=16, num_puzzle_identifiers=1,
                         augmentation="sudoku")
    arc = DatasetMeta(task="arc", vocab_size=12, seq_len=900, num_puzzle_identifiers=801,
                      augmentation="arc")
    for translate in ("auto", False):
        _quiet(lambda: stream.warn_unused(DataConfig(path="d", translate=translate), sudoku))
    _quiet(lambda: stream.warn_unused(DataConfig(path="d", translate=True), arc))
    with pytest.warns(UserWarning, match="data.translate=true has no effect on sudoku data"):
        stream.warn_unused(DataConfig(path="d", translate=True), sudoku)


@pytest.mark.parametrize("name", preset_names())
def test_presets_warn_about_nothing(name):
    cfg = _quiet(lambda: load_config(name))
    if cfg.resources.device != "cuda":  # auto may train on CPU
        _quiet(lambda: cfg.warn_unused_on_cpu(native_bf16=False))


@pytest.mark.parametrize("name", sorted(shipped_spaces()))
def test_search_spaces_warn_about_nothing(name, load_shipped):
    space = _quiet(lambda: load_shipped(name))
    for point in space.spec.start_from:  # the trials a sweep starts with
        _quiet(lambda: space.trial_config(point))


def test_overrides_set_dict_values_but_never_replace_a_section():
    cfg = build_config(apply_overrides(BASE, ["resources.worker_resources={accelerator_type:A100: 1}"]))
    assert cfg.resources.worker_resources == {"accelerator_type:A100": 1}
    with pytest.raises(ConfigError, match="train: give dotted keys"):
        with_values(BASE, {"train": {"steps": 600}})


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_a_renamed_key_is_refused_naming_its_new_key(old):
    section, key = old.split(".")
    new = RENAMED[old]
    with pytest.raises(ConfigError, match=rf"^{re.escape(old)} was renamed {re.escape(new)}"):
        build_config({**BASE, section: {key: 1}})
    new_section, new_key = new.split(".")
    assert hasattr(build_config(BASE).__dict__[new_section], new_key)


def test_renamed_keys_are_refused_from_yaml_overrides_and_search_spaces(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**BASE, "train": {"steps": 5, "eval_every": 0}}))
    with pytest.raises(ConfigError, match="train.eval_every was renamed eval.every: write eval.every=0"):
        load_config(str(path))
    with pytest.raises(ConfigError, match="train.num_workers was renamed resources.num_workers"):
        load_config("sudoku4-urm", ["train.num_workers=2"])
    space = {"base": "sudoku4-urm", "params": {"train.eval_max_rows": {"type": "int", "low": 2, "high": 4}},
             "objectives": [{"metric": "eval/exact_accuracy", "mode": "max"}], "trials": 2}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    with pytest.raises(ConfigError, match="parameter train.eval_max_rows: .* renamed eval.max_rows"):
        load_space(str(tmp_path / "space.yaml"))
    space = {**space, "params": {"model.loops": {"type": "int", "low": 2, "high": 4}},
             "overrides": {"train.checkpoint_every": 100}}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    with pytest.raises(ConfigError, match="train.checkpoint_every was renamed checkpoint.every"):
        load_space(str(tmp_path / "space.yaml"))


def test_a_checkpoints_saved_config_reads_its_old_keys_under_the_new_names():
    saved = yaml.safe_load((Path(__file__).parent / "fixtures" / "checkpoint-v1" / "config.yaml").read_text())
    assert saved["train"]["num_workers"] == 1  # written before the sections split
    cfg = _quiet(lambda: build_config(renamed(saved)))
    assert (cfg.resources.num_workers, cfg.checkpoint.every, cfg.eval.batch_size) == (
        saved["train"]["num_workers"], saved["train"]["checkpoint_every"], saved["train"]["eval_batch_size"])


def test_a_space_override_and_a_run_config_override_of_the_same_section_go_apart():
    space = load_space("quickstart", ["resources.workers=1", "checkpoint.every=0", "trials=3"])
    assert space.spec.resources.workers == 1 and space.spec.trials == 3
    assert space.base_config.checkpoint.every == 0


def test_a_run_recorded_before_a_rename_is_read_under_the_new_key():
    from urm_ray.runs import config_value
    from urm_ray.tracking import RunSummary

    old = RunSummary("id", "r", "FINISHED", {}, {"train.storage_path": "/old", "train.steps": "9"}, {})
    assert config_value(old, "checkpoint.storage_path", "") == "/old"
    assert config_value(old, "checkpoint.every", "-") == "-"
