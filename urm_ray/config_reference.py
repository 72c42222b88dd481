"""The configuration reference: every key of a run config and of a search-space file, with its
type, its default and its meaning, read from the config dataclasses.

    python -m urm_ray.config_reference > docs/reference/configuration.md

A key's meaning is the comment on its field: the ``#`` lines right above the field, or the
comment at the end of its line (a field that only changes an inherited default may leave it out:
the parent's comment then holds). Those comments are the one source; the page is generated, and
tests/test_config_reference.py fails when a field has no comment or the committed page is stale.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import sys
import tokenize
import types
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from urm_ray.config import RENAMED, SECTIONS, RunConfig
from urm_ray.models.registry import MODELS
from urm_ray.tune.params import ParamSpec
from urm_ray.tune.space import SpaceSpec
from urm_ray.typed import to_dict

COMMAND = "python -m urm_ray.config_reference > docs/reference/configuration.md"
# keys typed as a plain mapping whose values are themselves sections: (class, field) -> value class
MAPPED = {(SpaceSpec, "params"): ParamSpec}
# trailing comments addressed to tools, not readers
PRAGMAS = ("type:", "noqa", "pragma")


@dataclass(frozen=True)
class Entry:
    """One row of the reference: a leaf key of a section."""

    key: str  # dotted, e.g. model.loops, objectives[].metric, params.<key>.low
    type: str
    default: str
    meaning: str


@dataclass(frozen=True)
class Section:
    """One table: the leaf keys of one config class, under a heading and an introduction."""

    title: str
    intro: str
    entries: tuple[Entry, ...]


# --- where the meanings come from: the comments on each field --------------------------------


@functools.cache
def _file_comments(path: str) -> tuple[dict[int, str], dict[int, str]]:
    """(full-line comments, end-of-line comments) of a source file, by line number, '#' removed."""
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    lines = source.splitlines()
    full: dict[int, str] = {}
    trailing: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        row, col = tok.start
        text = tok.string.lstrip("#").strip()
        if lines[row - 1][:col].strip():
            if not text.startswith(PRAGMAS):
                trailing[row] = text
        else:
            full[row] = text
    return full, trailing


@functools.cache
def own_comments(cls: type) -> dict[str, str]:
    """The comment of every field ``cls`` declares itself (not inherited), by field name; a field
    without one is absent."""
    path = inspect.getsourcefile(cls)
    assert path is not None, f"{cls.__name__}: no source file"
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    full, trailing = _file_comments(path)
    out: dict[str, str] = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above = []
        row = stmt.lineno - 1
        while row in full:  # the comment block that ends on the line above the field
            above.insert(0, full[row])
            row -= 1
        rows = range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)
        after = [trailing[r] for r in rows if r in trailing]
        text = " ".join(part for part in above + after if part)
        if text:
            out[stmt.target.id] = text
    return out


def field_meaning(cls: type, name: str) -> str:
    """The comment on field ``name`` of ``cls``: the nearest class in the MRO that comments it."""
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass) and name in own_comments(klass):
            return own_comments(klass)[name]
    return ""


def class_intro(cls: type) -> str:
    """The first paragraph of a class's own docstring, on one line ("" for none: @dataclass then
    writes its signature there)."""
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


# --- types and defaults as a YAML file spells them ---------------------------------------------


def type_name(tp: Any) -> str:
    """An annotation as a reader of a YAML file would name it, e.g. ``bool or `auto` ``."""
    origin = get_origin(tp)
    if tp is Any:
        return "any"
    if origin is Literal:
        return _alternatives([f"`{_yaml(v)}`" for v in get_args(tp)])
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        names = [type_name(a) for a in args if a is not type(None)]
        return _alternatives(names + (["null"] if type(None) in args else []))
    if origin in (list, tuple):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        return f"list of {_plural(args[0])}" if args else "list"
    if tp in (list, tuple):
        return "list"
    if tp is dict or origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _plural(tp: Any) -> str:
    return "mappings" if dataclasses.is_dataclass(tp) else type_name(tp)


def _alternatives(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _yaml(value: Any) -> str:
    """A value in YAML flow style, on one line."""
    if value == "":
        return '""'
    text = yaml.safe_dump(to_dict(value), default_flow_style=True, width=10**6).strip()
    return text[: -len("...")].strip() if text.endswith("...") else text


def default_text(f: dataclasses.Field) -> str:
    """A field's default as YAML, or "required" for a field without one."""
    if f.default is not dataclasses.MISSING:
        return f"`{_yaml(f.default)}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{_yaml(f.default_factory())}`"
    return "required"


# --- the walk over the config classes -------------------------------------------------------


def ordered_fields(cls: type) -> list[dataclasses.Field]:
    """``cls``'s init fields, ``name`` first, then grouped by the class that first declares them:
    the main base chain (``__bases__[0]``) from its root, then the mixins (a GRAM family lists its
    core's fields before the guidance fields)."""
    chain, klass = [], cls
    while klass is not object:
        chain.insert(0, klass)
        klass = klass.__bases__[0]
    order = chain + [k for k in reversed(cls.__mro__) if k not in chain and k is not object]

    def rank(f: dataclasses.Field) -> int:
        if f.name == "name":
            return -1
        return min(i for i, k in enumerate(order) if f.name in getattr(k, "__annotations__", {}))

    fields = [f for f in dataclasses.fields(cls) if f.init]
    return sorted(fields, key=rank)  # stable: dataclass order within a group


def section_class(cls: type, f: dataclasses.Field) -> tuple[type, str] | None:
    """(class, key suffix) when field ``f`` of ``cls`` is itself a section, else None."""
    if (cls, f.name) in MAPPED:
        return MAPPED[(cls, f.name)], ".<key>"
    tp = get_type_hints(cls)[f.name]
    if dataclasses.is_dataclass(tp):
        return tp, ""
    if get_origin(tp) is list and get_args(tp) and dataclasses.is_dataclass(get_args(tp)[0]):
        return get_args(tp)[0], "[]"
    return None


def sections(cls: type, prefix: str, title: str, intro: str) -> list[Section]:
    """The table of ``cls`` at ``prefix`` (its leaf keys), then one per nested section."""
    hints = get_type_hints(cls)
    entries, nested = [], []
    for f in ordered_fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        inner = section_class(cls, f)
        if inner is None:
            entries.append(Entry(key, type_name(hints[f.name]), default_text(f), field_meaning(cls, f.name)))
            continue
        sub, suffix = inner
        sub_intro = _sentence(field_meaning(cls, f.name)) or class_intro(sub)
        nested += sections(sub, key + suffix, f"`{key}{suffix}`", sub_intro)
    return [Section(title, intro, tuple(entries)), *nested]


def _sentence(text: str) -> str:
    """A field comment as a paragraph: capitalised, with a full stop."""
    if not text:
        return ""
    return text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")


def model_sections() -> list[Section]:
    """One table per family registered in ``urm_ray.models.registry``."""
    out = []
    for name, (cls, _) in MODELS.items():
        out += sections(cls, "model", f"`model.name: {name}`", class_intro(cls))
    return out


def run_sections() -> list[Section]:
    """The run config's other sections: data, optim, train, resources, checkpoint, tracking, eval."""
    out = []
    for key, cls in SECTIONS.items():
        intro = _sentence(field_meaning(RunConfig, key)) or class_intro(cls)
        out += sections(cls, key, f"`{key}`", intro)
    return out


def space_sections() -> list[Section]:
    """The keys of a search-space file (``SpaceSpec``) and of its nested sections."""
    return sections(SpaceSpec, "", "Top-level keys", class_intro(SpaceSpec))


# --- the page ------------------------------------------------------------------------------


HEADER = f"""<!-- Generated by urm_ray/config_reference.py: edit the field comments, not this page. -->

# Configuration reference

Generated from the config dataclasses by `{COMMAND}`; a key's meaning is the comment on its
field in `urm_ray/`, so change it there and regenerate (`tests/test_config_reference.py` fails
while this page differs from the generator's output).

Every key is checked when a config loads: an unknown key, a value of the wrong type or one out of
range raises an error naming the dotted key, and a key set where it has no effect warns, saying
why. Types are as YAML writes them (`null` for none); "required" keys have no default.
"""

RUN_INTRO = """## Run config

A run config is a YAML file or the name of a preset in `urm_ray/presets` (`urm-ray presets` lists
them): `urm-ray train CONFIG [KEY=VALUE ...]`, where each override is a dotted key below, e.g.
`model.loops=8 train.steps=500`. It has eight sections: `model`, `data`, `optim`, `train` (the
schedule and the numerics), `resources` (where and on what it trains), `checkpoint` (where, how
often, how many), `tracking` and `eval` (the held-out evaluation during training, and test-time
compute); only `model.name` and `data.path` have no usable default.

Where two keys seem to name one idea, they name two. Noise: `model.state_noise` is the Gaussian
on a recurrent state during training and `eval.noise` its value at test time (as `eval.segments`
and `eval.loops` stand for `model.max_segments` and `model.loops` there); GRAM's
`model.noise_scale` scales its learned guidance and `model.sample_temperature` the prior it
samples from. Views: `data.num_augmentations` is how many augmented copies of each puzzle the
training data holds; `eval.views` makes the test-time trajectories such copies, `eval.width` of
them. Samples: `eval.samples` draws GRAM's prior at each evaluation during training; `eval.width`
spreads the test-time evaluation. Steps are optimizer steps (`train.steps`); ACT segments are
segments (`model.max_segments`, `eval.segments`).

### `model`

The model section's keys depend on `model.name`: one table per family (`urm_ray/models/registry.py`).
"""

SPACE_INTRO = """## Search-space file

A search space is a YAML file, a name in `./search_spaces` or one shipped in
`urm_ray/search_spaces`: `urm-ray sweep SPACE [KEY=VALUE ...]`. Overrides that name a run-config
key (`model.loops=4`, `checkpoint.every=0`, `resources.num_workers=2`) change the base config; the
others change the space (`trials=8`, `scheduler.grace_steps=50`, `resources.workers=2`,
`checkpoint=runs/x/checkpoint_...`). `<key>` stands for a dotted
run-config key (e.g. `params.model.loops.type`); `[]` for each item of a list.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_section(section: Section, level: str) -> str:
    """A section as a Markdown heading (``level``: "###", ...), its introduction and its table."""
    lines = [f"{level} {section.title}", ""]
    if section.intro:
        lines += [section.intro, ""]
    if section.entries:
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{e.key}` | {_cell(e.type)} | {_cell(e.default)} | {_cell(e.meaning)} |"
                  for e in section.entries]
        lines.append("")
    return "\n".join(lines)


def renamed_section() -> str:
    """The keys that were renamed, each with its new name: a config holding one is refused."""
    lines = ["### Renamed keys", "",
             "A config, override or search space that gives an old key is refused with its new name; "
             "a checkpoint's own saved `config.yaml` is read with its old keys under the new names.", "",
             "| old key | new key |", "|---|---|"]
    lines += [f"| `{old}` | `{new}` |" for old, new in RENAMED.items()]
    return "\n".join(lines) + "\n"


def render() -> str:
    """The whole page."""
    parts = [HEADER, RUN_INTRO]
    parts += [render_section(s, "####") for s in model_sections()]  # under the `model` heading
    parts += [render_section(s, "###") for s in run_sections()]
    parts.append(renamed_section())
    parts.append(SPACE_INTRO)
    parts += [render_section(s, "###") for s in space_sections()]
    return "\n".join(parts).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
