"""ARC-AGI: building from both layouts, tokens, augmentation and its inverse, identifiers, and every
bad input the builder must name. Real tasks come from tests/fixtures/arc-agi."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from urm_ray.cli import main
from urm_ray.data import originals, store
from urm_ray.data.tasks import arc
from urm_ray.data.tasks.arc import augment as arc_augment
from urm_ray.data.tasks.arc.evaluate import exact_match
from urm_ray.data.tasks.verify import verifier_for
from urm_ray.errors import ConfigError, DataError

# ARC-AGI-1 training + evaluation in the Kaggle layout, as downloaded (all 800 tasks)
ARC_DIR = Path(__file__).resolve().parent / "fixtures" / "arc-agi"


@pytest.fixture(scope="module")
def real() -> dict:
    """Challenges and solutions of ARC-AGI-1 training and evaluation."""
    return {s: (json.loads((ARC_DIR / f"arc-agi_{s}_challenges.json").read_text()),
                json.loads((ARC_DIR / f"arc-agi_{s}_solutions.json").read_text()))
            for s in ("training", "evaluation")}


def _kaggle(folder: Path, subsets: dict[str, tuple[dict, dict]], prefix: str = "arc-agi") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for subset, (challenges, solutions) in subsets.items():
        (folder / f"{prefix}_{subset}_challenges.json").write_text(json.dumps(challenges))
        (folder / f"{prefix}_{subset}_solutions.json").write_text(json.dumps(solutions))
    return folder


def _per_task(folder: Path, subsets: dict[str, tuple[dict, dict]]) -> Path:
    for subset, (challenges, solutions) in subsets.items():
        (folder / subset).mkdir(parents=True)
        for name, task in challenges.items():
            tests = [{"input": p["input"], "output": s}
                     for p, s in zip(task["test"], solutions[name])]
            (folder / subset / f"{name}.json").write_text(
                json.dumps({"train": task["train"], "test": tests}))
    return folder


def _few(real: dict, per_subset: int = 6) -> dict:
    """The first tasks of each real subset (challenges, solutions)."""
    out = {}
    for subset, (challenges, solutions) in real.items():
        names = sorted(challenges)[:per_subset]
        out[subset] = ({n: challenges[n] for n in names}, {n: solutions[n] for n in names})
    return out


@pytest.fixture(scope="module")
def small(real, tmp_path_factory) -> Path:
    """A dataset of 6 training + 6 evaluation tasks, evaluation held out."""
    src = _kaggle(tmp_path_factory.mktemp("src"), _few(real))
    out = tmp_path_factory.mktemp("data") / "arc"
    arc.build(out, src, ["training", "evaluation"], "evaluation")
    return out


# --- building ---------------------------------------------------------------------------------


def test_full_arc1_build_matches_the_files(real, tmp_path):
    meta = arc.build(tmp_path / "arc1", ARC_DIR)
    assert (meta.task, meta.vocab_size, meta.seq_len, meta.augmentation) == ("arc", 12, 900, "arc")
    assert meta.num_puzzle_identifiers == 801 and meta.build["num_tasks"] == 800
    demos = sum(len(t["train"]) for c, _ in real.values() for t in c.values())
    held = sum(len(t["test"]) for t in real["evaluation"][0].values())
    train_tests = sum(len(t["test"]) for t in real["training"][0].values())
    assert meta.splits["test"].num_rows == held == 419
    assert meta.splits["train"].num_rows == demos + train_tests
    table = arc.load_tasks(tmp_path / "arc1")
    test = store.read_split(tmp_path / "arc1", "test")
    train = store.read_split(tmp_path / "arc1", "train")
    # every held-out pair decodes to its solution; the task's demonstrations are in training
    for i in range(0, len(test["inputs"]), 37):
        record = table.records[test["puzzle_identifiers"][i] - 1]
        assert record["held_out"] and record["subset"] == "evaluation"
        j = test["puzzle_index"][i] - record["tests"]["first_pair"]
        challenge, solution = real["evaluation"][0][record["name"]], real["evaluation"][1]
        assert arc.decode(test["inputs"][i]).tolist() == challenge["test"][j]["input"]
        assert arc.decode(arc_augment.canonical(test["labels"][i:i + 1])[0]).tolist() == \
            solution[record["name"]][j]
        first = record["demos"]["first_pair"]
        assert set(range(first, first + record["demos"]["count"])) <= set(train["puzzle_index"])
    assert not set(test["puzzle_index"]) & set(train["puzzle_index"])


def test_tokens_and_labels():
    grid = np.array([[0, 9], [3, 4], [5, 6]], np.uint8)
    canvas = arc.encode(grid).reshape(30, 30)
    assert canvas[:3, :2].tolist() == [[2, 11], [5, 6], [7, 8]]
    assert (canvas[3, :2] == arc.EOS).all() and (canvas[:3, 2] == arc.EOS).all()
    assert canvas[3, 2] == arc.PAD and (canvas[4:] == 0).all() and (canvas[:, 3:] == 0).all()
    labels = arc.as_labels(canvas)
    assert (labels[canvas == 0] == -100).all()
    assert (labels[canvas != 0] == canvas[canvas != 0]).all()
    full = arc.encode(np.ones((30, 30), np.uint8))  # no room for EOS at the edges
    assert (full == 3).all()
    assert arc.decode(arc.encode(grid)).tolist() == grid.tolist()


def test_per_task_folder_gives_the_same_dataset(real, tmp_path):
    few = _few(real, 4)
    a = arc.build(tmp_path / "a", _kaggle(tmp_path / "kaggle", few), test_set="evaluation")
    b = arc.build(tmp_path / "b", _per_task(tmp_path / "per", few), test_set="evaluation")
    assert a.splits["train"].num_rows == b.splits["train"].num_rows > 0
    for split in ("train", "test"):
        x, y = store.read_split(tmp_path / "a", split), store.read_split(tmp_path / "b", split)
        assert all(np.array_equal(x[c], y[c]) for c in store.COLUMNS)
    tasks_a, tasks_b = (tmp_path / "a" / arc.TASKS_FILE), (tmp_path / "b" / arc.TASKS_FILE)
    assert tasks_a.read_text() == tasks_b.read_text()


def test_duplicate_task_keeps_the_test_set_copy(real, tmp_path):
    few = _few(real, 3)
    name = sorted(few["evaluation"][0])[0]
    challenges, solutions = dict(few["training"][0]), dict(few["training"][1])
    challenges[name], solutions[name] = few["evaluation"][0][name], few["evaluation"][1][name]
    src = _kaggle(tmp_path / "src", {"training": (challenges, solutions),
                                     "evaluation": few["evaluation"]})
    meta = arc.build(tmp_path / "d", src)
    assert meta.build["duplicates_dropped"] == [
        {"name": name, "subset": "training", "kept_in": "evaluation"}]
    records = arc.load_tasks(tmp_path / "d").records
    assert [r["subset"] for r in records if r["name"] == name] == ["evaluation"]


# --- dihedral transforms and the augmentation --------------------------------------------------


@pytest.mark.parametrize("d", range(8))
def test_each_dihedral_on_canvases_and_its_inverse(d):
    rng = np.random.default_rng(d)
    grids = [rng.integers(0, 10, (h, w)).astype(np.uint8) for h, w in
             [(1, 1), (3, 7), (30, 2), (30, 30), (12, 29)]]
    canvases = np.stack([arc.encode(g) for g in grids])
    dd = np.full(len(grids), d)
    moved, h, w = arc_augment.dihedral_canvases(canvases, dd, *arc_augment.shapes(canvases), 0)
    for g, m in zip(grids, moved):
        assert np.array_equal(m, arc.encode(arc.dihedral(g, d)))
        assert np.array_equal(arc.dihedral(arc.dihedral(g, d), arc.DIHEDRAL_INVERSE[d]), g)
    back, _, _ = arc_augment.dihedral_canvases(moved, np.full(len(grids), arc.DIHEDRAL_INVERSE[d]),
                                               h, w, 0)
    assert np.array_equal(back, canvases)
    assert d in (0, 6) or not np.array_equal(moved[1], canvases[1])


def _all_augs(cols: dict, k: int):
    rows = np.repeat(np.arange(len(cols["inputs"])), k)
    return rows, np.tile(np.arange(k), len(cols["inputs"])).astype(np.int32)


def test_augment_then_invert_gives_the_original_on_real_tasks(small):
    table = arc.load_tasks(small)
    train = store.read_split(small, "train")
    rows, aug = _all_augs(train, 12)
    ids = train["puzzle_identifiers"][rows]
    picked = {key: column[rows] for key, column in train.items()}
    x, y, new_ids = arc_augment.augment(picked, aug, 5, table, 12, False)
    assert np.array_equal(new_ids, 1 + (ids - 1) * 12 + aug)
    assert np.array_equal(x[aug == 0], train["inputs"])
    assert np.array_equal(y[aug == 0], train["labels"])
    assert np.array_equal(arc_augment.invert(x, ids, aug, 5, table), train["inputs"][rows])
    assert np.array_equal(arc_augment.invert(y, ids, aug, 5, table),
                          arc_augment.canonical(train["labels"][rows]))
    # the same transform for every pair of a task: a reference transform of the grid agrees
    for r in range(0, len(rows), 7):
        d, perm = arc_augment.draw_transforms(ids[r:r + 1], aug[r:r + 1], 5, table)
        grid = arc.decode(train["inputs"][rows[r]])
        assert np.array_equal(x[r], arc.encode(arc.dihedral(perm[0][grid], int(d[0]))))
    # colour 0 stays 0 (token 2), and no augmented task equals its original
    assert ((x == 2) == (train["inputs"][rows] == 2)).sum() > 0
    for ident in np.unique(ids):
        for a in range(1, 12):
            sel = (ids == ident) & (aug == a)
            same = np.array_equal(x[sel], train["inputs"][rows][sel]) and \
                np.array_equal(y[sel], train["labels"][rows][sel])
            assert not same, (ident, a)


def _version_grids(task: dict, solutions: list, d: np.ndarray, perm: np.ndarray) -> list[bytes]:
    """Every grid of a task (demonstrations, then tests) under each transform (d [V], perm [V, 10]),
    as one bytes key per version: the augmented task the versions must not repeat."""
    grids = [np.array(g, np.uint8) for p in task["train"] for g in (p["input"], p["output"])]
    grids += [np.array(g, np.uint8) for p, s in zip(task["test"], solutions)
              for g in (p["input"], s)]

    def key(dv: int, pv: np.ndarray) -> bytes:
        moved = [arc.dihedral(pv[g], dv) for g in grids]
        return b"|".join(m.tobytes() + bytes(m.shape) for m in moved)

    return [key(int(dv), pv) for dv, pv in zip(d, perm)]


# few colours: 9 to 576 distinct versions, where 1,001 independent draws repeat many
FEW_VERSION_TASKS = {"training": ["6f8cd79b", "28e73c20", "f8a8fe49"],
                     "evaluation": ["332efdb3", "0b17323b"]}


@pytest.fixture(scope="module")
def few_colours(real, tmp_path_factory) -> Path:
    picked = {sub: ({n: real[sub][0][n] for n in names}, {n: real[sub][1][n] for n in names})
              for sub, names in FEW_VERSION_TASKS.items()}
    src = _kaggle(tmp_path_factory.mktemp("few-src"), picked)
    out = tmp_path_factory.mktemp("few") / "arc"
    arc.build(out, src, ["training", "evaluation"], "evaluation")
    return out


def test_versions_of_real_tasks_are_distinct_augmented_tasks(real, few_colours, small):
    for folder, k in ((few_colours, 1001), (small, 200)):
        table = arc.load_tasks(folder)
        for t, record in enumerate(table.records, start=1):
            versions = int(arc_augment.distinct_versions(np.array([t]), table)[0])
            d, perm = arc_augment.draw_transforms(np.full(k, t), np.arange(k), 4, table)
            assert d[0] == 0 and (perm[0] == np.arange(10)).all() and (perm[:, 0] == 0).all()
            challenges, solutions = real[record["subset"]]
            got = _version_grids(challenges[record["name"]], solutions[record["name"]], d, perm)
            # all different up to the task's count, then the same versions again in order
            assert len(set(got[:versions])) == min(versions, k), record["name"]
            assert got[versions:] == got[:max(k - versions, 0)], record["name"]
    assert arc_augment.few_versions(arc.load_tasks(few_colours), 1001) == {
        "6f8cd79b": 18, "28e73c20": 72, "f8a8fe49": 576, "332efdb3": 9, "0b17323b": 288}


def test_a_task_with_few_versions_gets_them_all_then_repeats(tmp_path):
    # colour 1 only (0 is fixed), grids symmetric under d = 0, 2, 6, 7: 2 x 9 = 18 versions
    task = {"train": [{"input": [[1, 1], [1, 1]], "output": [[1]]}],
            "test": [{"input": [[0, 1], [1, 0]], "output": [[1]]}]}
    (tmp_path / "src" / "training").mkdir(parents=True)
    (tmp_path / "src" / "training" / "sym.json").write_text(json.dumps(task))
    arc.build(tmp_path / "d", tmp_path / "src", ["training"], "training")
    table = arc.load_tasks(tmp_path / "d")
    assert table.possible[1].tolist() == [True, False, True, False, False, False, True, True]
    k = 40
    aug = np.arange(k)
    d, perm = arc_augment.draw_transforms(np.ones(k, np.int64), aug, 0, table)
    got = _version_grids(task, [p["output"] for p in task["test"]], d, perm)
    assert len(set(got[:18])) == 18 and got[18:] == got[:k - 18]
    assert got[0] not in got[1:18]  # the original is index 0 only, until the versions run out
    blank = {"inputs": np.zeros((k, 900), np.int8), "labels": np.zeros((k, 900), np.int8),
             "puzzle_identifiers": np.ones(k, np.int64), "puzzle_index": np.zeros(k, np.int64)}
    _, _, ids = arc_augment.augment(blank, aug, 0, table, k, False)
    assert np.array_equal(ids, 1 + aug % 18)  # a repeated version shares its puzzle identifier
    assert arc_augment.few_versions(table, 18) == {}
    assert arc_augment.few_versions(table, 19) == {"sym": 18}
    # determinism: the same seed gives the same versions; another seed, the same 18 in another order
    again = arc_augment.draw_transforms(np.ones(k, np.int64), aug, 0, table)
    assert np.array_equal(again[0], d) and np.array_equal(again[1], perm)
    other = _version_grids(task, [p["output"] for p in task["test"]],
                           *arc_augment.draw_transforms(np.ones(18, np.int64), aug[:18], 1, table))
    assert set(other) == set(got[:18]) and other != got[:18] and other[0] == got[0]


def test_dihedral_product_table():
    grid = np.arange(6, dtype=np.uint8).reshape(2, 3)
    for d in range(8):
        for s in range(8):
            want = arc.dihedral(grid, arc_augment.DIHEDRAL_PRODUCT[d][s])
            assert np.array_equal(arc.dihedral(arc.dihedral(grid, s), d), want)


def test_translation_moves_input_and_label_together(small):
    table = arc.load_tasks(small)
    train = store.read_split(small, "train")
    rows, aug = _all_augs(train, 4)
    args = ({key: column[rows] for key, column in train.items()}, aug, 3, table, 4)
    x0, y0, _ = arc_augment.augment(*args, False)
    x1, y1, _ = arc_augment.augment(*args, True)
    assert (x1 != x0).any(1).mean() > 0.5
    for r in range(len(rows)):
        cells = np.argwhere(x1[r].reshape(30, 30) >= 2)
        dr, dc = cells.min(0)
        back_x = np.zeros((30, 30), np.int8)
        back_x[:30 - dr, :30 - dc] = x1[r].reshape(30, 30)[dr:, dc:]
        colours = lambda c: np.where(c >= 2, c, 0)  # noqa: E731 (EOS may fall off the edge)
        assert np.array_equal(colours(back_x.reshape(-1)), colours(x0[r])), r
        out = np.argwhere(y1[r].reshape(30, 30) >= 2).min(0)
        assert (out == (dr, dc)).all()


def test_translate_back_helper_is_a_shift():
    c = arc.encode(np.array([[1, 2]], np.uint8))[None]
    moved = arc_augment.translate(c, np.array([2]), np.array([3]), 0).reshape(30, 30)
    assert moved[2, 3:5].tolist() == [3, 4] and moved[3, 3:5].tolist() == [1, 1]


def test_identifiers_and_augmentations_do_not_depend_on_batching(small):
    table = arc.load_tasks(small)
    train = store.read_split(small, "train")
    rows, aug = _all_augs(train, 6)
    args = lambda sel: ({key: column[rows[sel]] for key, column in train.items()},  # noqa: E731
                        aug[sel], 11, table, 6, True)
    whole = arc_augment.augment(*args(np.arange(len(rows))))
    order = np.random.default_rng(0).permutation(len(rows))
    parts = [arc_augment.augment(*args(part)) for part in np.array_split(order, 5)]
    for i in range(3):
        assert np.array_equal(np.concatenate([p[i] for p in parts]), whole[i][order])
    other_seed = arc_augment.augment(*args(np.arange(len(rows)))[:2], 12, table, 6, True)
    assert not np.array_equal(other_seed[0], whole[0])


def test_crop_follows_the_official_rule():
    grid = np.arange(12).reshape(3, 4) % 10
    canvas = arc.encode(grid.astype(np.uint8)).reshape(30, 30).copy()
    assert [int(v[0]) for v in arc_augment.crop_shapes(canvas.reshape(1, -1))] == [3, 4]
    canvas[1, 2] = arc.EOS  # an EOS inside: the largest rectangle is 3 rows x 2 columns
    assert [int(v[0]) for v in arc_augment.crop_shapes(canvas.reshape(1, -1))] == [3, 2]
    canvas[0, 0] = arc.PAD
    assert [int(v[0]) for v in arc_augment.crop_shapes(canvas.reshape(1, -1))] == [0, 0]


def test_arc_exact_match_verifier():
    label = arc.as_labels(arc.encode(np.array([[1, 2], [3, 4]], np.uint8)))
    right = arc.encode(np.array([[1, 2], [3, 4]], np.uint8))
    noisy = right.copy().reshape(30, 30)
    noisy[10:, 10:] = 5  # junk outside the crop does not matter
    wrong_colour = arc.encode(np.array([[1, 2], [3, 5]], np.uint8))
    wrong_shape = arc.encode(np.array([[1, 2, 0], [3, 4, 0]], np.uint8))
    answers = torch.from_numpy(np.stack([right, noisy.reshape(-1), wrong_colour, wrong_shape]))
    labels = torch.from_numpy(np.stack([label] * 4))
    assert exact_match(answers, labels).tolist() == [True, True, False, False]
    with pytest.raises(ConfigError, match="one right answer per input and no verifier"):
        verifier_for("arc", 900)


# --- bad input ------------------------------------------------------------------------------------


def _one_task(**changes) -> dict:
    task = {"train": [{"input": [[1, 2], [3, 4]], "output": [[4]]}],
            "test": [{"input": [[0, 0]]}]}
    for path, value in changes.items():
        kind, index, field = path.split("_")
        task[kind][int(index)][field] = value
    return task


def _build_bad(tmp_path, challenges: dict | str, solutions: dict | str | None):
    src = tmp_path / "src"
    src.mkdir()
    text = challenges if isinstance(challenges, str) else json.dumps(challenges)
    (src / "arc-agi_evaluation_challenges.json").write_text(text)
    if solutions is not None:
        text = solutions if isinstance(solutions, str) else json.dumps(solutions)
        (src / "arc-agi_evaluation_solutions.json").write_text(text)
    arc.build(tmp_path / "out", src, ["evaluation"], "evaluation")


GOOD_SOLUTION = {"t1": [[[5]]]}


@pytest.mark.parametrize("grid,message", [
    ([[1, 2], [3]], "train pair 0 input: ragged grid, row 1 has 1 cells, row 0 has 2"),
    ([], "train pair 0 input: empty grid"),
    ([[]], "train pair 0 input: row 0 is empty"),
    ([[1, 10]], "train pair 0 input: colour 10 at row 0 column 1"),
    ([[-1]], "train pair 0 input: colour -1 at row 0 column 0"),
    ([[1, "3"]], "train pair 0 input: colour '3' at row 0 column 1"),
    ([[1.0]], "train pair 0 input: colour 1.0"),
    ([[True]], "train pair 0 input: colour true"),
    ([[0] * 31], "train pair 0 input: grid is 1x31, larger than 30x30"),
    ([[0]] * 31, "train pair 0 input: grid is 31x1"),
])
def test_bad_grids_name_file_task_and_pair(tmp_path, grid, message):
    with pytest.raises(DataError) as err:
        _build_bad(tmp_path, {"t1": _one_task(train_0_input=grid)}, GOOD_SOLUTION)
    assert "arc-agi_evaluation_challenges.json: task t1 " + message in str(err.value)
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_bad_solution_grid_is_named(tmp_path):
    with pytest.raises(DataError, match="task t1 test pair 0 output: colour 12 at row 0 column 0"):
        _build_bad(tmp_path, {"t1": _one_task()}, {"t1": [[[12]]]})


def test_malformed_json_names_file_line_and_task(tmp_path):
    good = json.dumps({"t0": _one_task()})[:-1]
    text = good + ', "t1": {"train": [{"input": [[1, 2], [3, 4]], "output": [[4]]},, ]}}'
    with pytest.raises(DataError, match=r"challenges.json: malformed JSON at line 1 column \d+ "
                                        r"\(in task t1\)"):
        _build_bad(tmp_path, text, GOOD_SOLUTION)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("solutions,message", [
    ({}, "task t1 test pair 0: challenge without its solution .no entry in"),
    ({"t1": []}, "task t1 test pair 0: challenge without its solution"),
    (None, r"task t1 test pair 0: challenge without its solution \(arc-agi_evaluation_solutions"),
])
def test_challenge_without_solution(tmp_path, solutions, message):
    with pytest.raises(DataError, match=message):
        _build_bad(tmp_path, {"t1": _one_task()}, solutions)
    assert not (tmp_path / "out").exists()


def test_per_task_file_without_output_and_missing_input(tmp_path):
    (tmp_path / "src" / "evaluation").mkdir(parents=True)
    (tmp_path / "src" / "evaluation" / "abc.json").write_text(json.dumps(_one_task()))
    with pytest.raises(DataError, match=r"abc.json: task abc test pair 0: no solution \(output\)"):
        arc.build(tmp_path / "out", tmp_path / "src", ["evaluation"], "evaluation")
    task = _one_task(test_0_output=[[1]])
    del task["train"][0]["input"]
    (tmp_path / "src" / "evaluation" / "abc.json").write_text(json.dumps(task))
    with pytest.raises(DataError, match="task abc train pair 0: no input"):
        arc.build(tmp_path / "out", tmp_path / "src", ["evaluation"], "evaluation")
    assert not (tmp_path / "out").exists()


def test_unknown_subset_and_test_set(real, tmp_path):
    # the fixture holds ARC-AGI-1 only; a download with ARC-AGI-2 would list training2 and evaluation2
    with pytest.raises(DataError,
                       match=r"unknown subset 'trainig'; available: \['evaluation', 'training'\]"):
        arc.build(tmp_path / "out", ARC_DIR, ["trainig", "evaluation"], "evaluation")
    with pytest.raises(ConfigError, match="test_set='eval' must be one of the subsets"):
        arc.build(tmp_path / "out", ARC_DIR, ["training", "evaluation"], "eval")
    assert not (tmp_path / "out").exists()


def test_cli_data_arc(real, tmp_path, capsys):
    src = _per_task(tmp_path / "per", _few(real, 2))
    assert main(["data", "arc", "--source", str(src), "--out", str(tmp_path / "d")]) == 0
    assert "4 tasks" in capsys.readouterr().out
    meta = store.read_metadata(tmp_path / "d")
    assert meta.build["arguments"]["subsets"] == ["training", "evaluation"]
    assert main(["data", "arc", "--source", str(src), "--out", str(tmp_path / "e"),
                 "--subsets", "training", "nope", "--test-set", "training"]) == 2
    assert "unknown subset 'nope'" in capsys.readouterr().err
    # --tasks N: the first N tasks of each subset in task-id order; more than a subset has fails
    assert main(["data", "arc", "--source", str(src), "--out", str(tmp_path / "f"),
                 "--subsets", "evaluation", "--test-set", "evaluation", "--tasks", "1"]) == 0
    assert "1 tasks" in capsys.readouterr().out
    first = sorted(real["evaluation"][0])[0]
    assert [r["name"] for r in arc.load_tasks(tmp_path / "f").records] == [first]
    assert store.read_metadata(tmp_path / "f").build["arguments"]["num_tasks"] == 1
    for bad, message in (("3", "num_tasks=3 is more than the 2 tasks of subset 'training'"),
                         ("-1", "num_tasks=-1 must be an int >= 0")):
        assert main(["data", "arc", "--source", str(src), "--out", str(tmp_path / "g"),
                     "--tasks", bad]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "g").exists()


# --- the Ray Data stream and `urm-ray eval` (slow: Ray, MLflow) ------------------------------------


def _stream_rows(ds, shards: int = 1) -> dict:
    """(pair, aug index) -> (inputs, labels, identifier) over every shard of one pass."""
    from urm_ray.data import stream

    out = {}
    parts = ds.split(shards) if shards > 1 else [ds]
    for part in parts:
        for b in stream.iter_torch_batches(part, 64, shuffle=False, device="cpu"):
            for p, a, x, y, i in zip(b["puzzle_index"].tolist(), b["aug_index"].tolist(),
                                     b["inputs"].numpy(), b["labels"].numpy(),
                                     b["puzzle_identifiers"].tolist()):
                assert (p, a) not in out, "a (pair, aug index) streamed twice"
                out[(p, a)] = (x.astype(np.int8), y.astype(np.int8), i)
    return out


@pytest.mark.slow
def test_stream_round_trip_and_stable_identifiers(small, ray_local):
    from urm_ray.data import stream
    from urm_ray.data.config import DataConfig

    cfg = DataConfig(path=str(small), num_augmentations=5, translate=False, shuffle_seed=2)
    train, table = store.read_split(small, "train"), arc.load_tasks(small)
    rows = _stream_rows(stream.train_dataset(cfg))
    assert len(rows) == 5 * len(train["inputs"])
    by_pair = {p: i for i, p in enumerate(train["puzzle_index"].tolist())}
    keys = sorted(rows)
    pair_rows = np.array([by_pair[p] for p, _ in keys])
    aug = np.array([a for _, a in keys], np.int32)
    ids = train["puzzle_identifiers"][pair_rows]
    x = np.stack([rows[k][0] for k in keys])
    y = np.stack([rows[k][1] for k in keys])
    assert np.array_equal(arc_augment.invert(x, ids, aug, 2, table), train["inputs"][pair_rows])
    assert np.array_equal(arc_augment.invert(y, ids, aug, 2, table),
                          arc_augment.canonical(train["labels"][pair_rows]))
    assert [rows[k][2] for k in keys] == (1 + (ids - 1) * 5 + aug).tolist()
    # with translation: the same rows from a second run and from two shards ("two workers")
    cfg = DataConfig(path=str(small), num_augmentations=5, shuffle_seed=2)
    one, two = _stream_rows(stream.train_dataset(cfg)), _stream_rows(stream.train_dataset(cfg), 2)
    assert sorted(one) == sorted(two) == keys
    assert all(np.array_equal(one[k][0], two[k][0]) and one[k][2] == two[k][2] for k in keys)
    assert sum(not np.array_equal(one[k][0], rows[k][0]) for k in keys) > len(keys) // 2
    ev = originals.read_originals(cfg, store.read_metadata(small))
    test = store.read_split(small, "test")
    assert ev["puzzle_index"].tolist() == test["puzzle_index"].tolist() and not ev["aug_index"].any()
    # aug index 0's rows of a table with 5 slots per task
    assert ev["puzzle_identifiers"].tolist() == (1 + (test["puzzle_identifiers"] - 1) * 5).tolist()
    assert stream.puzzle_table_size(store.read_metadata(small), cfg) == 1 + 12 * 5


@pytest.mark.slow
def test_eval_cli_on_a_checkpoint_logs_to_mlflow(small, tmp_path, capsys):
    from urm_ray import tracking
    from urm_ray.config import load_config
    from urm_ray.data import stream
    from urm_ray.models.registry import TaskSpec, build_model
    from urm_ray.train import checkpoint
    from urm_ray.typed import to_dict

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config("sudoku4-urm", [
        f"data.path={small}", "data.num_augmentations=3", "model.hidden_size=16",
        "model.num_heads=2", "model.num_layers=1", "model.loops=2", "model.max_segments=2",
        "model.puzzle_emb_dim=16", "train.run_name=arc-tiny", f"tracking.tracking_uri={uri}",
        "tracking.experiment=arc-test"])
    meta = store.read_metadata(small)
    table = stream.puzzle_table_size(meta, cfg.data)
    model = build_model(cfg.model, TaskSpec(meta.vocab_size, meta.seq_len, table))
    assert model.puzzle_emb.weights.shape[0] == 1 + 12 * 3  # 12 tasks x 3 augmentation slots
    folder = tmp_path / "ckpt"
    folder.mkdir()
    checkpoint.save(folder, model, None, [], checkpoint.Position(step=7), to_dict(cfg))
    out = tmp_path / "report.json"
    assert main(["eval", str(folder), "--max-rows", "2", "--augmentations", "2", "--halt-early",
                 "--pass-k", "1", "2", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    report = json.loads(out.read_text())
    metrics = {k: v for k, v in report.items() if k.startswith("arc/")}  # by their MLflow names
    assert {k: printed[k] for k in metrics} == metrics and printed["step"] == 7 and "tasks" not in printed
    assert set(metrics) >= {"arc/pass_at_1", "arc/pass_at_2", "arc/compute_saved"}
    assert metrics["arc/predictions"] == 4 and report["tasks"]
    run_id = tracking.find_run_id(uri, "arc-test", "arc-tiny/eval-test")
    assert run_id == printed["mlflow_run_id"]
    logged = tracking.Run(uri, run_id).summary().metrics
    assert logged["arc/pass_at_2"] == metrics["arc/pass_at_2"]


def test_bench_arc_build_reports_build_and_augment_figures(real, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "arc_build", Path(__file__).resolve().parents[1] / "bench" / "arc_build.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    src = _kaggle(tmp_path / "src", _few(real, 3))
    out = tmp_path / "bench.json"
    result = bench.main(["--source", str(src), "--stream-rows", "0", "--augment-rows", "3000",
                         "--json", str(out)])
    assert json.loads(out.read_text())["official"]["peak_ram_gb"] == 15.5
    assert result["build_wall_s"] > 0 and 0 < result["build_peak_rss_mb"] < 4096
    assert 0 < result["disk_mb"] < 5 and result["augment_rows_per_cpu_s"] > 0
