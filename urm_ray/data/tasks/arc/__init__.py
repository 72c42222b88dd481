"""ARC-AGI datasets: the official tokens, read from the Kaggle-combined or per-task JSON layout.

Sources (`source` is a folder):
    Kaggle-combined  <source>/<prefix>_<subset>_challenges.json and ..._solutions.json
    per-task         <source>/<subset>/<task id>.json, {"train": [...], "test": [...]} with outputs

Tokens, as in the official HRM / TRM / URM builders: each grid sits at the top-left of a 30x30
canvas (seq_len 900, row-major), PAD 0, EOS 1 on the row below and the column right of the grid,
colour c -> token c + 2 (vocab 12). Labels hold the ignore label where the canvas is PAD, so the
loss covers colours and EOS (the official ignore_label_id is PAD).

The task's parts: this module (tokens, reading, the builder and `urm-ray data arc`, the task
table), `augment` (a whole task's versions and their inverse), `evaluate` (voting, pass@k) and
`task` (the registry entry that hands these to the stream and the evaluators).

Rows are (input, output) pairs. Every pair goes to split "train" except the test pairs of the
test-set tasks, which go to "test"; the demonstrations of test-set tasks stay in training, as in
the official protocol. `puzzle_identifiers` = 1 + task number (0 is the blank identifier) and
`puzzle_index` = the pair's number; `arc_tasks.json` lists, per task, its name, subset, which pair
numbers went to which split, and its symmetries (used to skip augmentations equal to the original).

    build("data/arc1", "/data/arc-agi", subsets=["training", "evaluation"], test_set="evaluation")
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from urm_ray.data.store import DatasetMeta, check_output_folder, write_dataset
from urm_ray.errors import ConfigError, DataError
from urm_ray.progress import DATA_PROGRESS_EVERY_S, Progress

logger = logging.getLogger("urm_ray.data")

NAME = AUGMENTATION = "arc"  # metadata.json's task and augmentation
PASS_KS = (1, 2, 10, 100, 1000)  # pass@k reported on held-out pairs
SIDE = 30  # canvas side; grids are at most 30x30
SEQ_LEN = SIDE * SIDE
PAD, EOS, COLOUR_OFFSET = 0, 1, 2
NUM_COLOURS = 10
VOCAB_SIZE = COLOUR_OFFSET + NUM_COLOURS
IGNORE_LABEL = -100
TASKS_FILE = "arc_tasks.json"
# dihedral transform d and its inverse (official numbering: 0 id, 1-3 rot90 k=1..3, 4 flip lr,
# 5 flip ud, 6 transpose, 7 anti-transpose)
DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)


def dihedral(grid: np.ndarray, d: int) -> np.ndarray:
    """Dihedral transform `d` of a 2-D grid (the official `dihedral_transform`)."""
    ops = (
        lambda a: a,
        lambda a: np.rot90(a, 1),
        lambda a: np.rot90(a, 2),
        lambda a: np.rot90(a, 3),
        np.fliplr,
        np.flipud,
        lambda a: a.T,
        lambda a: np.fliplr(np.rot90(a, 1)),
    )
    return np.ascontiguousarray(ops[d](grid))


# --- tokens ---------------------------------------------------------------------------------------


def encode(grid: np.ndarray) -> np.ndarray:
    """[900] int8 canvas of a grid (colours 0-9): top-left, EOS right and below, PAD elsewhere."""
    h, w = grid.shape
    canvas = np.full((SIDE, SIDE), PAD, np.int8)
    canvas[:h, :w] = grid + COLOUR_OFFSET
    if h < SIDE:
        canvas[h, :w] = EOS
    if w < SIDE:
        canvas[:h, w] = EOS
    return canvas.reshape(SEQ_LEN)


def as_labels(canvases: np.ndarray) -> np.ndarray:
    """Label canvases: PAD becomes the ignore label."""
    return np.where(canvases == PAD, IGNORE_LABEL, canvases).astype(canvases.dtype)


def decode(canvas: np.ndarray) -> np.ndarray:
    """The grid (colours 0-9) of a canvas whose grid sits at the top-left (stored or canonical)."""
    canvas = np.asarray(canvas).reshape(SIDE, SIDE)
    h = int((canvas[:, 0] >= COLOUR_OFFSET).sum())
    w = int((canvas[0, :] >= COLOUR_OFFSET).sum())
    return (canvas[:h, :w] - COLOUR_OFFSET).astype(np.uint8)


# --- reading and validating -----------------------------------------------------------------------


@dataclass
class Task:
    """One ARC task: demonstration pairs and test pairs, grids as uint8 arrays."""

    name: str
    subset: str
    demos: list[tuple[np.ndarray, np.ndarray]]
    tests: list[tuple[np.ndarray, np.ndarray]]


def parse_grid(value: Any, where: str) -> np.ndarray:
    """A validated grid; DataError naming `where` (file, task, pair, field) otherwise."""
    if isinstance(value, list) and value and all(isinstance(row, list) for row in value):
        try:
            arr = np.array(value)
        except ValueError:  # ragged: numpy refuses inhomogeneous rows
            arr = None
        cell_types = {type(cell) for row in value for cell in row}
        if (arr is not None and arr.ndim == 2 and arr.size and cell_types == {int}
                and arr.min() >= 0 and arr.max() < NUM_COLOURS and max(arr.shape) <= SIDE):
            return arr.astype(np.uint8)
    _raise_grid_error(value, where)


def _raise_grid_error(value: Any, where: str) -> NoReturn:
    """Finds the first problem of a grid that failed the fast check and raises it."""
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: empty grid or not a list of rows ({_short(value)})")
    width = None
    for r, row in enumerate(value):
        if not isinstance(row, list) or not row:
            raise DataError(f"{where}: row {r} is empty or not a list ({_short(row)})")
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise DataError(
                f"{where}: ragged grid, row {r} has {len(row)} cells, row 0 has {width}")
        for c, cell in enumerate(row):
            if type(cell) is not int or not 0 <= cell < NUM_COLOURS:
                raise DataError(
                    f"{where}: colour {_short(cell)} at row {r} column {c}, expected an int 0-9"
                )
    raise DataError(f"{where}: grid is {len(value)}x{width}, larger than {SIDE}x{SIDE}")


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _read_json(path: Path) -> Any:
    """Parsed JSON; DataError naming the file, line, column and the task the error is in."""
    try:
        text = path.read_text()
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err})") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        # task keys: `"id": {"train"...` (challenges) or `"id": [[[` (solutions)
        tasks = re.findall(r'"([^"\\]+)"\s*:\s*(?:\{\s*"(?:train|test)"|\[\s*\[\s*\[)',
                           text[: err.pos])
        near = f" (in task {tasks[-1]})" if tasks else ""
        raise DataError(
            f"{path}: malformed JSON at line {err.lineno} column {err.colno}{near}: {err.msg}"
        ) from err


def _pairs(raw: Any, where: str, kind: str, need_output: bool) -> list[dict[str, Any]]:
    pairs = raw.get(kind) if isinstance(raw, dict) else None
    if not isinstance(pairs, list) or not pairs:
        raise DataError(f"{where}: '{kind}' must be a non-empty list of pairs")
    for i, pair in enumerate(pairs):
        keys = ("input", "output") if need_output else ("input",)
        if not isinstance(pair, dict) or any(k not in pair for k in keys):
            missing = "solution (output)" if isinstance(pair, dict) and "input" in pair else "input"
            raise DataError(f"{where} {kind} pair {i}: no {missing}")
    return pairs


def _task(name: str, subset: str, raw: Any, where: str, solutions: list[Any] | None) -> Task:
    """Validated Task from a JSON object; `solutions` (Kaggle layout) fills the test outputs."""
    demos = _pairs(raw, where, "train", need_output=True)
    tests = _pairs(raw, where, "test", need_output=solutions is None)
    if solutions is not None:
        for i in range(len(tests)):
            if i >= len(solutions):
                raise DataError(f"{where} test pair {i}: challenge without its solution")
        tests = [{"input": p["input"], "output": s} for p, s in zip(tests, solutions)]

    def grids(kind: str, pairs: list[dict[str, Any]]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [
            (parse_grid(p["input"], f"{where} {kind} pair {i} input"),
             parse_grid(p["output"], f"{where} {kind} pair {i} output"))
            for i, p in enumerate(pairs)
        ]

    return Task(name, subset, grids("train", demos), grids("test", tests))


def available_subsets(source: Path, prefix: str) -> list[str]:
    """Subset names found in `source`: Kaggle files with `prefix`, or sub-folders of JSON files."""
    pattern = re.compile(rf"{re.escape(prefix)}_(.+)_challenges\.json")
    kaggle = [m.group(1) for p in source.glob("*.json") if (m := pattern.fullmatch(p.name))]
    folders = [p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.json"))]
    return sorted(set(kaggle) | set(folders))


def read_subset(source: Path, subset: str, prefix: str) -> tuple[int, Iterator[Task]]:
    """(number of tasks, the validated tasks in name order) of one subset; DataError for an unknown
    subset. Tasks are parsed one at a time as the iterator is consumed."""
    challenges = source / f"{prefix}_{subset}_challenges.json"
    if challenges.is_file():
        return _read_kaggle(challenges, source / f"{prefix}_{subset}_solutions.json", subset)
    if (source / subset).is_dir():
        paths = sorted((source / subset).glob("*.json"))
        return len(paths), (_task(p.stem, subset, _read_json(p), f"{p}: task {p.stem}", None)
                            for p in paths)
    found = available_subsets(source, prefix) if source.is_dir() else []
    raise DataError(
        f"{source}: unknown subset {subset!r}; available: {found} (looked for {challenges.name}"
        f" and the folder {subset}/)"
    )


def _read_kaggle(challenges: Path, solutions: Path, subset: str) -> tuple[int, Iterator[Task]]:
    tasks = _read_json(challenges)
    if not isinstance(tasks, dict):
        raise DataError(f"{challenges}: expected an object of task id -> task")
    if not solutions.is_file():
        first = next(iter(tasks), "?")
        raise DataError(
            f"{challenges}: task {first} test pair 0: challenge without its solution"
            f" ({solutions.name} not found)"
        )
    sols = _read_json(solutions)
    if not isinstance(sols, dict):
        raise DataError(f"{solutions}: expected an object of task id -> list of output grids")

    def parse() -> Iterator[Task]:
        for name in sorted(tasks):
            if name not in sols:
                raise DataError(
                    f"{challenges}: task {name} test pair 0: challenge without its solution"
                    f" (no entry in {solutions.name})"
                )
            if not isinstance(sols[name], list):
                raise DataError(f"{solutions}: task {name}: expected a list of output grids")
            yield _task(name, subset, tasks[name], f"{challenges}: task {name}", sols[name])

    return len(tasks), parse()


# --- symmetries: which augmentations reproduce the task ---------------------------------------


def invariants(grids: list[np.ndarray]) -> dict[str, str]:
    """For each dihedral d under which some colour permutation p (fixing 0) maps every grid of the
    task onto itself, the colours p must send each colour to: d -> 10 characters, the target
    colour or '.' for a colour the task does not use. Always has d = 0 (p = identity on the used
    colours); an augmentation (d, p) equals the original task exactly when it agrees here."""
    out = {}
    for d in range(8):
        seen = np.zeros((NUM_COLOURS, NUM_COLOURS), bool)  # [moved colour, original colour]
        for grid in grids:
            moved = dihedral(grid, d) if d else grid
            if moved.shape != grid.shape:
                break
            codes = moved.ravel().astype(np.int64) * NUM_COLOURS + grid.ravel()
            seen |= (np.bincount(codes, minlength=NUM_COLOURS**2) > 0).reshape(seen.shape)
            if not _is_colour_permutation(seen):
                break
        else:
            target = np.where(seen.any(1), seen.argmax(1), -1)
            out[str(d)] = "".join("." if t < 0 else str(t) for t in target)
    return out


def _is_colour_permutation(seen: np.ndarray) -> bool:
    """`seen` [10, 10] pairs (a, b) are part of a permutation that keeps colour 0."""
    return bool((seen.sum(0) <= 1).all() and (seen.sum(1) <= 1).all()
                and not seen[0, 1:].any() and not seen[1:, 0].any())


# --- building -------------------------------------------------------------------------------------


@dataclass
class _Collected:
    tasks: list[dict[str, Any]]
    inputs: dict[str, list[np.ndarray]]
    labels: dict[str, list[np.ndarray]]
    pair_index: dict[str, list[int]]
    identifiers: dict[str, list[int]]


def _collect(tasks: list[Task], test_set: str) -> _Collected:
    out = _Collected([], {"train": [], "test": []}, {"train": [], "test": []},
                     {"train": [], "test": []}, {"train": [], "test": []})
    pair = 0
    for number, task in enumerate(tasks):
        held_out = task.subset == test_set
        record: dict[str, Any] = {"name": task.name, "subset": task.subset,
                                  "identifier": number + 1, "held_out": held_out}
        for kind, pairs, split in (("demos", task.demos, "train"),
                                   ("tests", task.tests, "test" if held_out else "train")):
            record[kind] = {"split": split, "first_pair": pair, "count": len(pairs)}
            for grid_in, grid_out in pairs:
                out.inputs[split].append(encode(grid_in))
                out.labels[split].append(encode(grid_out))
                out.pair_index[split].append(pair)
                out.identifiers[split].append(number + 1)
                pair += 1
        grids = [g for pairs in (task.demos, task.tests) for p in pairs for g in p]
        record["invariants"] = invariants(grids)
        out.tasks.append(record)
    return out


def _read_tasks(source: Path, subsets: list[str], test_set: str, prefix: str,
                max_tasks: int = 0
                ) -> tuple[list[Task], list[dict[str, str]]]:
    """Tasks of every subset, in subset order (the first `max_tasks` of each by name, 0 = all); a
    name seen twice keeps the test-set copy (so no test pair leaks into training), else the first."""
    by_subset: dict[str, list[Task]] = {}
    for subset in subsets:
        count, tasks = read_subset(source, subset, prefix)
        if max_tasks:
            if max_tasks > count:
                raise ConfigError(f"num_tasks={max_tasks} is more than the {count} tasks of subset"
                                  f" {subset!r}: give at most {count}, or 0 for all")
            count, tasks = max_tasks, itertools.islice(tasks, max_tasks)
        progress = Progress(f"arc {subset}", count, unit="tasks", every_s=DATA_PROGRESS_EVERY_S)
        by_subset[subset] = []
        for task in tasks:
            by_subset[subset].append(task)
            progress.update(len(by_subset[subset]))
        progress.finish(len(by_subset[subset]))
    owner: dict[str, str] = {t.name: test_set for t in by_subset[test_set]}
    kept, dropped = [], []
    for subset in subsets:
        for task in by_subset[subset]:
            if owner.setdefault(task.name, subset) == subset:
                kept.append(task)
            else:
                dropped.append({"name": task.name, "subset": subset, "kept_in": owner[task.name]})
    if dropped:
        logger.info("arc: %d tasks appear in two subsets; dropped the copies %s", len(dropped),
                    sorted({(d["subset"], d["kept_in"]) for d in dropped}))
    return kept, dropped


def build(
    out_dir: str | os.PathLike,
    source: str | os.PathLike,
    subsets: list[str] | tuple[str, ...] = ("training", "evaluation"),
    test_set: str = "evaluation",
    *,
    prefix: str = "arc-agi",
    overwrite: bool = False,
    num_tasks: int = 0,
) -> DatasetMeta:
    """Reads `subsets` from `source` and writes splits "train" and "test" plus `arc_tasks.json`.

    `num_tasks` > 0 keeps the first `num_tasks` tasks of each subset in task-id order (a small,
    deterministic dataset, e.g. the arc-tiny preset's). Everything is validated before anything
    is written, and the folder appears atomically."""
    source = Path(source)
    subsets = list(subsets)
    if not source.is_dir():
        raise DataError(f"{source}: ARC source folder not found")
    if not subsets or len(set(subsets)) != len(subsets):
        raise ConfigError(f"subsets={subsets} must be a non-empty list without repeats")
    if test_set not in subsets:
        raise ConfigError(f"test_set={test_set!r} must be one of the subsets {subsets}")
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 0:
        raise ConfigError(f"num_tasks={num_tasks!r} must be an int >= 0 (0 = every task)")
    tasks, dropped = _read_tasks(source, subsets, test_set, prefix, num_tasks)
    got = _collect(tasks, test_set)
    splits = {
        split: {
            "inputs": np.array(got.inputs[split], np.int8).reshape(-1, SEQ_LEN),
            "labels": as_labels(np.array(got.labels[split], np.int8).reshape(-1, SEQ_LEN)),
            "puzzle_identifiers": np.array(got.identifiers[split], np.int32),
            "puzzle_index": np.array(got.pair_index[split], np.int64),
        }
        for split in ("train", "test")
    }
    counts = {s: len(got.pair_index[s]) for s in splits}
    logger.info("arc: %d tasks, %d train pairs, %d test pairs", len(tasks), counts["train"],
                counts["test"])
    build_info = {
        "builder": "arc.build",
        "arguments": {"subsets": subsets, "test_set": test_set, "prefix": prefix,
                      "num_tasks": num_tasks},
        "seed": None,
        "source": str(source.resolve()),
        "num_tasks": len(tasks),
        "num_pairs": counts,
        "tasks_file": TASKS_FILE,
        "duplicates_dropped": dropped,
    }
    meta = DatasetMeta(task=NAME, vocab_size=VOCAB_SIZE, seq_len=SEQ_LEN,
                       num_puzzle_identifiers=len(tasks) + 1, augmentation=AUGMENTATION,
                       ignore_label=IGNORE_LABEL, build=build_info)
    tasks_json = "[\n" + ",\n".join(json.dumps(t) for t in got.tasks) + "\n]\n"
    return write_dataset(out_dir, splits, meta, overwrite=overwrite,
                         extra_files={TASKS_FILE: tasks_json})


# --- reading the task table back ------------------------------------------------------------------


@dataclass
class TaskTable:
    """`arc_tasks.json` as arrays indexed by puzzle identifier (row 0 = the blank identifier)."""

    records: list[dict[str, Any]]
    # [T + 1, 8, 10] int8: colour that colour c must go to for (d, p) to reproduce the task; -1 any
    fixing: np.ndarray
    # [T + 1, 8] bool: some colour permutation with dihedral d reproduces the task
    possible: np.ndarray

    def name(self, identifier: int) -> str:
        return self.records[identifier - 1]["name"]


def load_tasks(path: str | os.PathLike) -> TaskTable:
    """The task table of an ARC dataset folder; DataError if it is missing or malformed."""
    file = Path(path) / TASKS_FILE
    if not file.is_file():
        raise DataError(f"{file}: not found; was {path} built by `urm-ray data arc`?")
    try:
        records = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"{file}: invalid JSON ({err})") from err
    fixing = np.full((len(records) + 1, 8, NUM_COLOURS), -1, np.int8)
    possible = np.zeros((len(records) + 1, 8), bool)
    for number, record in enumerate(records, start=1):
        if record.get("identifier") != number:
            raise DataError(f"{file}: task {record.get('name')!r} has identifier"
                            f" {record.get('identifier')!r}, expected {number}")
        for d, target in record["invariants"].items():
            possible[number, int(d)] = True
            fixing[number, int(d)] = [-1 if ch == "." else int(ch) for ch in target]
    return TaskTable(records, fixing, possible)


# --- builder command ------------------------------------------------------------------------------


def _build_command(args: argparse.Namespace) -> None:
    check_output_folder(args.out, args.overwrite)  # before reading any input
    meta = build(args.out, args.source, subsets=args.subsets, test_set=args.test_set,
                 prefix=args.prefix, overwrite=args.overwrite, num_tasks=args.tasks)
    print(f"wrote {args.out}: {meta.build['num_tasks']} tasks, pairs {meta.build['num_pairs']}")


def add_builder(data: argparse._SubParsersAction) -> None:
    """`urm-ray data arc`."""
    a = data.add_parser("arc", help="ARC-AGI from Kaggle-combined or per-task JSON files")
    a.add_argument("--source", required=True,
                   help="folder with <prefix>_<subset>_challenges.json / _solutions.json, or"
                        " with one sub-folder of <task>.json files per subset")
    a.add_argument("--out", required=True, help="dataset folder to create")
    a.add_argument("--subsets", nargs="+", default=["training", "evaluation"],
                   help="subsets to include (ARC-AGI-2: training2 evaluation2)")
    a.add_argument("--test-set", default="evaluation",
                   help="subset whose test pairs are held out (its demonstrations train)")
    a.add_argument("--prefix", default="arc-agi", help="Kaggle file prefix")
    a.add_argument("--tasks", type=int, default=0, metavar="N",
                   help="keep the first N tasks of each subset in task-id order (default 0: all)")
    a.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --out")
    a.set_defaults(func=_build_command)

