"""The package's layers: read every module's imports (ast; nothing is imported or run) and fail
where two parts of urm_ray import each other, directly or round a longer loop.

A part is a folder under urm_ray/ (``urm_ray/train``, ``urm_ray/data`` with its subfolders) or a
module at the top (``urm_ray/config.py``). Imports inside functions count as well: a lazy import
is still an arrow, and the arrows must all point one way down the layers."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "urm_ray"
# the loops that still stand, each named so that a new one fails and a mended one must leave here
STANDING: list[list[str]] = []


def _part(module: str) -> str | None:
    """The part a dotted module name of urm_ray belongs to (None: outside urm_ray)."""
    names = module.split(".")
    if names[0] != "urm_ray" or len(names) < 2:
        return None
    if (PACKAGE / names[1]).is_dir():
        return f"urm_ray/{names[1]}"
    return f"urm_ray/{names[1]}.py" if (PACKAGE / f"{names[1]}.py").is_file() else None


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The import statements under ``if TYPE_CHECKING:``: annotations only, never run."""
    hidden: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            hidden.update(n for stmt in node.body for n in ast.walk(stmt))
    return hidden


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        # ``from urm_ray import tracking`` names a module; ``from urm_ray.x import y`` a name of x
        return [f"{node.module}.{alias.name}" for alias in node.names] if node.module == "urm_ray" else [node.module]
    return []


def import_graph() -> dict[str, dict[str, set[str]]]:
    """part -> {imported part: the files of the first part that import it}."""
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        source = _part(".".join(relative.with_suffix("").parts))
        tree = ast.parse(path.read_text(), str(path))
        hidden = _type_checking_only(tree)
        for node in ast.walk(tree):
            for module in [] if node in hidden else _imported(node):
                target = _part(module)
                if source and target and target != source:
                    graph[source][target].add(str(relative))
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected groups of more than one part (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(part: str) -> None:
        index[part] = low[part] = len(index)
        stack.append(part)
        for target in graph.get(part, {}):
            if target not in index:
                visit(target)
                low[part] = min(low[part], low[target])
            elif target in stack:
                low[part] = min(low[part], index[target])
        if low[part] == index[part]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == part:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for part in sorted(graph):
        if part not in index:
            visit(part)
    return found


def test_the_graph_sees_the_layers_it_should():
    graph = import_graph()
    assert "urm_ray/eval" in graph["urm_ray/train"]  # the loop's in-run evaluation
    assert "urm_ray/train" in graph["urm_ray/evaluate.py"]  # a checkpoint loads as training resumes it
    assert "urm_ray/metrics.py" in graph["urm_ray/data"]  # ARC's pass@k counts as every score does
    assert cycles({"a": {"b": set()}, "b": {"c": set()}, "c": {"a": set()}, "d": {"a": set()}}) == [["a", "b", "c"]]


def test_no_two_parts_of_the_package_import_each_other():
    graph = import_graph()
    loops = cycles(graph)
    shown = [" <-> ".join(group) + ": " + "; ".join(
        f"{a} -> {b} ({', '.join(sorted(graph[a][b]))})" for a in group for b in group if b in graph[a])
        for group in loops]
    new = [line for group, line in zip(loops, shown) if group not in STANDING]
    assert not new, "parts of urm_ray that import each other:\n" + "\n".join(new)
    assert [group for group in STANDING if group not in loops] == []  # mended: no longer standing


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}", node))
    return found


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Named parameters and *args / **kwargs, less a method's self or cls."""
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    count = len(names) + (args.vararg is not None) + (args.kwarg is not None)
    return count - (bool(names) and names[0] in ("self", "cls"))


def test_every_function_is_small_enough_to_read_at_once():
    functions = _functions()
    assert len(functions) > 500  # the walk sees the package
    too_many = [f"{name}: {_parameters(node)} parameters" for name, node in functions
                if _parameters(node) > 8]
    too_long = [f"{name}: {node.end_lineno - node.lineno + 1} lines" for name, node in functions
                if node.end_lineno - node.lineno + 1 > 60]
    assert too_many == [] and too_long == [], "\n".join(too_many + too_long)
