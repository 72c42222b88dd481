"""Every task through the registry, as a user meets it: built by `urm-ray data <task>`, streamed
by Ray Data with its augmentation, each augmented row inverted back onto its stored puzzle, and
the augmented answers accepted by the task's verifier (ARC: matched against the label)."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from urm_ray.cli import main
from urm_ray.data import augment, store
from urm_ray.data.config import DataConfig
from urm_ray.data.tasks import registry
from urm_ray.data.tasks.arc import augment as arc_augment
from urm_ray.data.tasks.arc import load_tasks
from urm_ray.data.tasks.arc.evaluate import exact_match
from urm_ray.data.tasks.verify import verifier_for
from urm_ray.errors import ConfigError, DataError

ARC_DIR = Path(__file__).resolve().parent / "fixtures" / "arc-agi"
K = 3  # augmentation slots streamed per puzzle
SEED = 4

# `urm-ray data <task>` arguments of a tiny dataset of each task
BUILD_ARGS = {
    "sudoku": ["--size", "4", "--num-train", "24", "--num-test", "4", "--blanks", "6"],
    "maze": ["--size", "9", "--num-train", "6", "--num-test", "2", "--min-path", "8"],
    "nqueens": ["--size", "5", "--repeats", "2"],
    "coloring": ["--nodes", "6", "--colors", "3", "--num-train", "24", "--num-test", "4",
                 "--edge-prob", "0.5"],
    "arc": ["--source", str(ARC_DIR), "--subsets", "evaluation", "--test-set", "evaluation",
            "--tasks", "3"],
}


def test_every_task_is_registered_with_a_builder():
    assert set(registry.TASKS) == set(BUILD_ARGS)
    for name, task in registry.TASKS.items():
        assert task.name == name and callable(task.add_builder)
        assert (task.augment is None) == (task.augmentation == "none" or task.versions is not None)
    with pytest.raises(ConfigError, match="unknown task 'chess'"):
        registry.get("chess")


def _streamed(folder: Path) -> dict[str, np.ndarray]:
    """One pass of the training stream (K slots, no translation), as arrays in stream order."""
    from urm_ray.data import stream

    cfg = DataConfig(path=str(folder), num_augmentations=K, shuffle_seed=SEED, translate=False)
    batches = list(stream.iter_torch_batches(stream.train_dataset(cfg), 256, shuffle=False,
                                             device="cpu"))
    return {key: torch.cat([b[key] for b in batches]).numpy() for key in batches[0]}


def _originals(folder: Path, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stored training row of each streamed row (by puzzle_index; repeats share content)."""
    train = store.read_split(folder, "train")
    where = {int(p): i for i, p in enumerate(train["puzzle_index"])}
    index = np.array([where[int(p)] for p in rows["puzzle_index"]])
    return {key: value[index] for key, value in train.items()}


def _inverted(task, folder: Path, rows, original) -> tuple[np.ndarray, np.ndarray]:
    """Streamed (inputs, labels) mapped back onto their stored puzzles by the task's inverse."""
    if task.versions is not None:
        table = load_tasks(folder)
        ids = original["puzzle_identifiers"]
        return tuple(arc_augment.invert(rows[k], ids, rows["aug_index"], SEED, table)
                     for k in ("inputs", "labels"))
    if task.augment is None:
        return rows["inputs"], rows["labels"]
    return tuple(augment.invert_batch(task.augment, rows[k], original["inputs"], original["labels"],
                                      rows["puzzle_index"], rows["aug_index"], SEED)
                 for k in ("inputs", "labels"))


@pytest.mark.parametrize("name", sorted(BUILD_ARGS))
def test_task_round_trips_through_the_registry(name, tmp_path, ray_local, capsys):
    folder = tmp_path / name
    assert main(["data", name, "--out", str(folder), *BUILD_ARGS[name]]) == 0
    assert f"wrote {folder}" in capsys.readouterr().out
    meta = store.read_metadata(folder)
    task = registry.of(meta)
    assert task is registry.get(name) and meta.task == name

    if task.augment is None and task.versions is None:  # K slots of an unaugmented task: said
        with pytest.warns(UserWarning, match="has no augmentation"):
            rows = _streamed(folder)
    else:
        rows = _streamed(folder)
    original = _originals(folder, rows)
    assert len(rows["inputs"]) == K * meta.splits["train"].num_rows
    moved = rows["aug_index"] > 0
    changed = (rows["inputs"] != original["inputs"]).any(axis=1)
    assert not changed[~moved].any()  # aug index 0 is the stored puzzle
    assert changed[moved].any() == (task.augment is not None or task.versions is not None)

    inputs, labels = _inverted(task, folder, rows, original)
    want = arc_augment.canonical(original["labels"]) if task.versions is not None else original["labels"]
    assert np.array_equal(inputs, original["inputs"]) and np.array_equal(labels, want)

    answers = torch.from_numpy(rows["labels"].astype(np.int64))
    if task.verifier is None:  # one right answer: the augmented label is that answer
        assert exact_match(answers, answers).all()
        return
    accepts = verifier_for(name, meta.seq_len)
    x = torch.from_numpy(rows["inputs"].astype(np.int64))
    assert accepts(answers, x, answers).all()  # the augmented answer solves the augmented input
    wrong = answers.clone()
    wrong[:, :] = int(answers.max())  # one token everywhere: no task's valid answer
    assert not accepts(wrong, x, answers).any()


def test_metadata_naming_an_unknown_task_or_augmentation_is_refused(tmp_path):
    assert main(["data", "nqueens", "--out", str(tmp_path / "q"), "--size", "4"]) == 0
    meta = store.read_metadata(tmp_path / "q")
    with pytest.raises(DataError, match="q/metadata.json: task 'chess' is not a known task"):
        registry.of(replace(meta, task="chess"), f"{tmp_path}/q/metadata.json")
    with pytest.raises(DataError, match="augmentation 'sudoku' is not task 'nqueens'"):
        registry.of(replace(meta, augmentation="sudoku"))


def test_only_the_arc_task_knows_it_is_arc():
    """The package asks a task for its pieces (``PuzzleTask.versions``, ``.scoring``): no module
    outside the ARC folder (and the registry that lists it) imports ARC code or branches on a
    ``versioned`` flag."""
    import ast

    import urm_ray

    package = Path(urm_ray.__file__).parent
    allowed = {package / "data" / "tasks" / "registry.py"}
    found = []
    for path in sorted(package.rglob("*.py")):
        if (package / "data" / "tasks" / "arc") in path.parents or path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                names = []
            if any(n == "urm_ray.data.tasks.arc" or n.startswith("urm_ray.data.tasks.arc.") for n in names):
                found.append(f"{path.relative_to(package)}:{node.lineno} imports ARC code")
            if isinstance(node, (ast.Attribute, ast.Name)) and "versioned" in (getattr(node, "attr", None),
                                                                               getattr(node, "id", None)):
                found.append(f"{path.relative_to(package)}:{node.lineno} checks `versioned`")
    assert not found, found
    assert registry.get("arc").versions is not None and registry.get("arc").scoring is not None
    assert all(registry.get(name).versions is None and registry.get(name).scoring is None for name in BUILD_ARGS
               if name != "arc")
