"""Search spaces: every shipped space validates; bad spaces fail before any trial, naming the
parameter; define-by-run sampling respects dependent bounds; expressions are arithmetic only."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import optuna
import pytest
import yaml

from urm_ray.errors import ConfigError
from urm_ray.tune.expr import Expr
from urm_ray.tune.space import load_space, shipped_spaces

SHIPPED = sorted(shipped_spaces().values())
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
BASE = {
    "base": "sudoku4-urm",
    "params": {
        "model.loops": {"type": "int", "low": 2, "high": 6},
        "model.truncation": {"type": "int", "low": 0, "high": "model.loops - 1"},
        "optim.lr": {"type": "log_float", "low": 1.0e-4, "high": 3.0e-3},
        "model.ffn": {"type": "categorical", "choices": ["swiglu", "conv_swiglu"]},
    },
    "trials": 4,
}


def _space(tmp_path: Path, **changes) -> Path:
    data = {**BASE, **changes}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_shipped_spaces_include_the_documented_list():
    names = {p.stem for p in SHIPPED}
    assert {"quickstart", "urm-sudoku", "urm-arc1", "urm-arc2", "gram", "trm", "hrm"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_space_validates(path: Path, load_shipped):
    space = load_shipped(str(path))
    assert space.params and space.spec.trials >= 1
    if path.stem.startswith("urm-arc"):  # ARC sweeps rank by pass@2 over voted views
        assert space.metric == "arc/pass_at_2" and space.base_config.eval.views and space.base_config.eval.width > 1
    # paper-centred spaces start from the paper's point, which must lie inside the space
    for point in space.spec.start_from:
        space.trial_config(point)


def test_shipped_spaces_load_by_name_from_the_package(tmp_path: Path, monkeypatch, load_shipped):
    """Found through the installed package, not a source checkout's folder (cwd elsewhere)."""
    monkeypatch.chdir(tmp_path)
    package = Path(str(resources.files("urm_ray"))) / "search_spaces"
    assert SHIPPED and all(p.parent == package for p in SHIPPED)
    for name in shipped_spaces():
        assert load_shipped(name).name == name


def test_every_shipped_yaml_is_package_data():
    """pyproject's package-data globs cover every YAML in the package, so a wheel has them."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    patterns = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-data"]["urm_ray"]
    package = Path(str(resources.files("urm_ray")))
    shipped = {p for pattern in patterns for p in package.glob(pattern)}
    assert shipped == set(package.rglob("*.yaml"))


def test_gram_space_searches_the_kl_coefficient():
    assert "model.kl_coef" in [p.key for p in load_space("gram").params]


def test_valid_space_and_overrides(tmp_path: Path):
    space = load_space(str(_space(tmp_path)), ["trials=7", "train.steps=300", "eval.every=50",
                                               "scheduler.grace_steps=100"])
    assert space.spec.trials == 7 and space.steps == 300
    assert [p.key for p in space.params] == ["model.loops", "model.truncation", "optim.lr", "model.ffn"]


@pytest.mark.parametrize("params, match", [
    ({"model.loopz": {"type": "int", "low": 2, "high": 4}}, "model.loopz: unknown config key"),
    ({"optim.lr": {"type": "float", "low": 1.0e-2, "high": 1.0e-3}}, r"optim.lr: empty range"),
    ({"optim.lr": {"type": "log_float", "low": 0.0, "high": 1.0e-3}}, r"optim.lr: log range"),
    ({"model.ffn": {"type": "categorical", "choices": []}}, "model.ffn: categorical needs"),
    # truncation may reach loops: the config rejects truncation == loops
    ({"model.loops": {"type": "int", "low": 2, "high": 6},
      "model.truncation": {"type": "int", "low": 0, "high": "model.loops"}}, "model.truncation"),
    # the bound is empty for small loop counts
    ({"model.loops": {"type": "int", "low": 1, "high": 6},
      "model.truncation": {"type": "int", "low": 1, "high": "model.loops - 1"}},
     r"model.truncation: empty range \[1, 0\] when model.loops=1"),
    ({"model.truncation": {"type": "int", "low": 0, "high": "model.loops - 1"},
      "model.loops": {"type": "int", "low": 2, "high": 6}}, "declared later"),
    ({"model.loops": {"type": "float", "low": 2, "high": 6}}, "model.loops"),
    ({"train.steps": {"type": "int", "low": 100, "high": 200}}, "train.steps: set by the sweep"),
    # inside the range, not at its ends: loops = 3 gives a bound of 1.5
    ({"model.loops": {"type": "int", "low": 2, "high": 8},
      "model.truncation": {"type": "int", "low": 0, "high": "model.loops / 2"}},
     r"model.truncation: high=1.5 is not an integer when model.loops=3"),
    # 64 and 128 split into 4 heads of an even size, 68 does not
    ({"model.hidden_size": {"type": "int", "low": 64, "high": 128, "step": 4}},
     r"impossible combination \{'model.hidden_size': 68\}.*model.hidden_size=68 must be divisible"),
])
def test_bad_spaces_name_the_parameter(tmp_path: Path, params, match):
    with pytest.raises(ConfigError, match=match):
        load_space(str(_space(tmp_path, params=params)))


def test_bad_objective_scheduler_and_start_point(tmp_path: Path):
    with pytest.raises(ConfigError, match="accuracy"):
        load_space(str(_space(tmp_path, objectives=[{"metric": "accuracy", "mode": "max"}])))
    with pytest.raises(ConfigError, match=r"arc/pass_at_2 is reported only with eval.views=true \(the arc task"):
        load_space(str(_space(tmp_path, objectives=[{"metric": "arc/pass_at_2", "mode": "max"}])))
    with pytest.raises(ConfigError, match="multiple of eval.every"):
        load_space(str(_space(tmp_path)), ["scheduler.grace_steps=30"])
    point = {"model.loops": 4, "model.truncation": 4, "optim.lr": 1e-3, "model.ffn": "swiglu"}
    with pytest.raises(ConfigError, match="model.truncation=4 is outside"):
        load_space(str(_space(tmp_path, start_from=[point])))
    with pytest.raises(ConfigError, match="unknown key"):
        load_space(str(_space(tmp_path, trails=4)))


def test_define_by_run_respects_dependent_bounds(tmp_path: Path):
    space = load_space(str(_space(tmp_path)))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(40):
        trial = study.ask()
        values = space.suggest(trial)
        assert 0 <= values["model.truncation"] < values["model.loops"] <= 6
        cfg = space.trial_config(values)
        assert cfg.model.truncation == values["model.truncation"]
        study.tell(trial, 0.0)


def test_bounds_may_read_fixed_config_values(tmp_path: Path):
    params = {"model.loops": {"type": "int", "low": 1, "high": "16 // model.max_segments"}}
    space = load_space(str(_space(tmp_path, params=params)), ["model.max_segments=8",
                                                                  "model.truncation=0"])
    assert space.params[0].bounds(space.env({})) == (1, 2)


def test_expressions_are_arithmetic_only():
    assert Expr("min(4, model.loops - 1)").evaluate({"model.loops": 3}) == 2
    values = {"eval/mean_segments": 2.5, "model.loops": 4}
    assert Expr("eval/mean_segments * model.loops").evaluate(values) == 10
    with pytest.raises(ConfigError, match="not allowed"):
        Expr("__import__('os')")
    with pytest.raises(ConfigError, match="unknown name"):
        Expr("model.loops.__class__").evaluate({"model.loops": 2})


def test_trial_retries_default_on_for_gpu_spaces(tmp_path: Path):
    assert load_space("quickstart").retries == 0  # CPU: a failure is a bug, not a preemption
    assert load_space("urm-sudoku").retries == 2  # spot GPU nodes get reclaimed
    assert load_space(str(_space(tmp_path, retries=5))).retries == 5
    with pytest.raises(ConfigError, match="retries=-1 is out of range"):
        load_space(str(_space(tmp_path, retries=-1)))


@pytest.mark.parametrize("text, problem", [
    ("max()", "max() takes 2 or more arguments, got 0"),
    ("min(model.loops)", "min() takes 2 or more arguments, got 1"),
    ("round(1, 2, 3)", "round() takes 1 or 2 arguments, got 3"),
    ("int()", "int() takes 1 argument, got 0"),
    ("max(*model.loops)", "is not allowed"),
    ("int(1e999)", "holds a number too large for a float"),
    ("-" * 5000 + "1", "nested deeper than 50 operators or calls"),
    ("(" * 300 + "1" + ")" * 300, "not valid arithmetic"),
    ("1 +", "not valid arithmetic"),
    ("a\x00b", "not valid arithmetic"),
])
def test_a_bad_expression_is_named_when_it_is_read(text: str, problem: str):
    with pytest.raises(ConfigError) as caught:
        Expr(text, "model.truncation.high")
    message = str(caught.value)
    assert message.startswith("model.truncation.high=") and problem in message
    assert len(message) < 250 and "\n" not in message  # a long expression is cut


def test_what_an_expression_cannot_compute_is_named_with_the_values_it_read():
    values = {"model.loops": float("inf"), "eval/x": 0.0, "model.hidden_size": 64}
    with pytest.raises(ConfigError, match=r"^k='int\(model.loops\)': cannot be computed for "
                                          r"\{'model.loops': inf\} \(cannot convert float infinity"):
        Expr("int(model.loops)", "k").evaluate(values)
    with pytest.raises(ConfigError, match=r"^k='1 / eval/x': divides by zero for \{'eval/x': 0.0\}$"):
        Expr("1 / eval/x", "k").evaluate(values)
    with pytest.raises(ConfigError, match=r"is not finite \(inf\) for \{'model.loops': inf\}$"):
        Expr("model.loops * 2", "k").evaluate(values)
    assert Expr("-" * 50 + "1").evaluate({}) == 1  # as deep as allowed


def test_bad_bounds_and_derived_metrics_name_their_key(tmp_path: Path):
    params = {**BASE["params"], "model.truncation": {"type": "int", "low": 0, "high": "max()"}}
    with pytest.raises(ConfigError, match=r"space.yaml: model.truncation.high='max\(\)': max\(\) takes"):
        load_space(str(_space(tmp_path, params=params)))
    with pytest.raises(ConfigError, match=r"space.yaml: derived.c/x='1 / / 2': not valid arithmetic"):
        load_space(str(_space(tmp_path, derived={"c/x": "1 / / 2"})))
