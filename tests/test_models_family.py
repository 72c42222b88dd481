"""Model families as specs (urm_ray.models.family, registry.FAMILIES): callers ask the spec, never
probe a model or its config; test-time settings run without writing the model's config."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import torch

import urm_ray
from urm_ray.eval.config import EvalConfig
from urm_ray.eval.testtime import applied, evaluate_testtime
from urm_ray.models.family import TestTime
from urm_ray.models.gram import GuidanceConfig
from urm_ray.models.registry import FAMILIES, build_model, family

from tiny import TASK, batch, trainer

PACKAGE = Path(urm_ray.__file__).parent
# every class a family's config or model is made of, as named in the package
FAMILY_TYPES = {cls.__name__ for spec in FAMILIES.values() for cls in (*spec.config.__mro__, *spec.model.__mro__)
                if cls.__module__.startswith("urm_ray.models.")}
WRAPPER_ATTRS = {"_orig_mod", "module"}  # torch.compile's and DDP's wrapped module, not a family's
ON_MODEL = re.compile(r"\b(model|config)\b")  # model, cfg.model, unwrap_model(model), model.config, config


def probes(source: str) -> list[str]:
    """The family probes in ``source``: ``hasattr`` on a model or model config, ``getattr`` on one
    with a default, ``isinstance`` against a family's config or model class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        call, subject = node.func.id, ast.unparse(node.args[0])
        if call == "hasattr" and ON_MODEL.search(subject):
            found.append(ast.unparse(node))
        elif call == "getattr" and len(node.args) == 3 and ON_MODEL.search(subject):
            attr = node.args[1]
            if not (isinstance(attr, ast.Constant) and attr.value in WRAPPER_ATTRS):
                found.append(ast.unparse(node))
        elif call == "isinstance" and len(node.args) == 2:
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if named & FAMILY_TYPES:
                found.append(ast.unparse(node))
    return found


def test_no_family_probes_outside_the_model_package():
    found = {f"{path.relative_to(PACKAGE.parent)}: {probe}"
             for path in sorted(PACKAGE.rglob("*.py")) if PACKAGE / "models" not in path.parents
             for probe in probes(path.read_text())}
    assert not found, "ask the family's spec (urm_ray.models.registry.family) instead:\n" + "\n".join(sorted(found))


def test_the_probe_rule_catches_each_kind_of_probe():
    assert probes("hasattr(cfg.model, 'loops')\ngetattr(model, 'sample_halt', 'limit')\n"
                  "getattr(config, 'loops', None)\nisinstance(cfg.model, GuidanceConfig)\n"
                  "isinstance(m, (URM, int))") == [
        "hasattr(cfg.model, 'loops')", "getattr(model, 'sample_halt', 'limit')", "getattr(config, 'loops', None)",
        "isinstance(cfg.model, GuidanceConfig)", "isinstance(m, (URM, int))"]
    assert probes("getattr(model, '_orig_mod', None)\nisinstance(model, dict)\nmodel.max_segments\n"
                  "getattr(args, 'verbose', False)") == []


def test_each_spec_says_what_its_config_and_model_are():
    for name, spec in FAMILIES.items():
        fields = {f.name for f in dataclasses.fields(spec.config)}
        assert spec.config().name == name and family(name) is spec
        assert spec.samples == issubclass(spec.config, GuidanceConfig) == (spec.objective == "guided"), name
        assert not spec.has_loops or {"loops", "truncation"} <= fields, name
        assert spec.state_noise == ("state_noise" in fields and not spec.samples), name
    assert [n for n, s in FAMILIES.items() if s.has_loops] == ["urm", "gram_urm"]  # the transformer's is fixed at 1


def test_testtime_settings_leave_the_model_and_its_config_as_they_were_and_equal_a_model_built_with_them():
    state = trainer("urm", False)
    model = state.model.eval()
    config = model.config
    assert state.cfg.model is config  # the run config's model section: what an in-run evaluation must not change
    fields, attrs = dataclasses.asdict(config), dict(vars(model))
    data = batch(6)
    settings = EvalConfig(width=2, segments=model.max_segments + 1, loops=4, noise=0.5, seed=1)
    with applied(model, settings):
        sums = evaluate_testtime(model, data, settings)
        assert dataclasses.asdict(config) == fields and state.cfg.model is config  # not written, even now
    assert vars(model).keys() == attrs.keys()
    assert all(vars(model)[key] is value for key, value in attrs.items())  # the very same objects
    assert dataclasses.asdict(model.config) == fields

    built = dataclasses.replace(config, loops=4, state_noise=0.5, max_segments=config.max_segments + 1)
    twin = build_model(built, TASK).eval()
    twin.load_state_dict(model.state_dict())
    expected = evaluate_testtime(twin, data, settings)
    assert sums.keys() == expected.keys() and float(sums["passes"]) == 2 * 8 * (config.max_segments + 1) * 4
    for key in sums.keys() - {"seconds"}:
        assert torch.equal(sums[key], expected[key]), key


def test_a_sampling_temperature_holds_only_inside_the_hook():
    model = trainer("gram", False).model.eval()
    spec, own = family("gram"), model.sample_temperature
    with spec.running_with(model, TestTime(temperature=own / 2)) as running:
        assert running is model and model.sample_temperature == own / 2
    assert model.sample_temperature == own and model.config.sample_temperature == own
