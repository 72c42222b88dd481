"""The generated configuration reference: every config field has a meaning, the page lists every
key, and the committed page is exactly what the generator writes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import get_args, get_origin, get_type_hints

import pytest

from urm_ray import config_reference
from urm_ray.config import SECTIONS
from urm_ray.models.registry import MODELS
from urm_ray.tune.params import ParamSpec
from urm_ray.tune.space import SpaceSpec

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "configuration.md"


def _keys(cls: type, prefix: str) -> list[str]:
    """Every leaf key below a config class, walked here without the generator's help."""
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = get_type_hints(cls)[f.name]
        if cls is SpaceSpec and f.name == "params":  # a plain dict whose values are ParamSpecs
            out += _keys(ParamSpec, f"{key}.<key>")
        elif dataclasses.is_dataclass(tp):
            out += _keys(tp, key)
        elif get_origin(tp) is list and dataclasses.is_dataclass(get_args(tp)[0]):
            out += _keys(get_args(tp)[0], f"{key}[]")
        else:
            out.append(key)
    return out


def _expected() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Section title -> the keys its table must list: the run config's, then the search space's
    (a title may be in both: each file has a `resources` section)."""
    run = {f"`model.name: {name}`": _keys(cls, "model") for name, (cls, _) in MODELS.items()}
    run.update({f"`{name}`": _keys(cls, name) for name, cls in SECTIONS.items()})
    space: dict[str, list[str]] = {}
    for key in _keys(SpaceSpec, ""):
        head = key.rsplit(".", 1)[0] if "." in key else ""
        space.setdefault(f"`{head}`" if head else "Top-level keys", []).append(key)
    return run, space


@pytest.fixture(scope="module")
def sections() -> list[config_reference.Section]:
    ref = config_reference
    return ref.model_sections() + ref.run_sections() + ref.space_sections()


def test_every_config_field_has_a_meaning(sections) -> None:
    missing = [e.key for s in sections for e in s.entries if not e.meaning]
    assert not missing, f"config fields without a comment (add one on or above the field): {missing}"
    assert all(s.intro for s in sections), [s.title for s in sections if not s.intro]


def test_the_reference_lists_every_field_of_every_section() -> None:
    ref = config_reference
    for part, expected in zip((ref.model_sections() + ref.run_sections(), ref.space_sections()), _expected()):
        listed = {s.title: [e.key for e in s.entries] for s in part}
        for title, keys in expected.items():
            assert title in listed, f"no section {title} in the reference"
            assert sorted(listed[title]) == sorted(keys), title
    page = PAGE.read_text()
    for keys in (keys for expected in _expected() for keys in expected.values()):
        for key in keys:
            assert f"| `{key}` |" in page, f"{key} is missing from {PAGE.name}"


def test_the_committed_page_is_the_generators_output() -> None:
    assert PAGE.read_text() == config_reference.render(), (
        f"{PAGE} is stale: run `{config_reference.COMMAND}`")


def test_meanings_come_from_the_comments_above_or_beside_a_field() -> None:
    from urm_ray.config import TrainConfig
    from urm_ray.models.transformer import TransformerConfig

    assert config_reference.field_meaning(TrainConfig, "steps") == "optimizer steps (one ACT segment each)"
    assert config_reference.field_meaning(TrainConfig, "label_targets").startswith("the answer loss's")
    # a field that only changes an inherited default keeps its parent's meaning
    assert config_reference.field_meaning(TransformerConfig, "max_segments").startswith("ACT: one segment")
    assert config_reference.field_meaning(TransformerConfig, "rope_theta") == "RoPE base"
    assert "type: ignore" not in config_reference.field_meaning(TransformerConfig, "name")


def test_types_and_defaults_read_as_yaml() -> None:
    from typing import Literal, Optional

    assert config_reference.type_name(bool | Literal["auto"]) == "bool or `auto`"
    assert config_reference.type_name(Literal["a", "b", "c"]) == "`a`, `b` or `c`"
    assert config_reference.type_name(Optional[float]) == "float or null"
    assert config_reference._yaml("") == '""' and config_reference._yaml(None) == "null"
    assert config_reference._yaml({}) == "{}" and config_reference._yaml(True) == "true"
