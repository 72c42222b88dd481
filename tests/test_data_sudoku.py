"""Sudoku generator, verifier and CSV converter."""

import json
from pathlib import Path

import numpy as np
import pytest

from urm_ray.data import store
from urm_ray.data.tasks import sudoku
from urm_ray.data.tasks.sudoku_solver import count_solutions
from urm_ray.errors import ConfigError, DataError


@pytest.mark.parametrize("n,blanks,count", [(4, 10, 40), (6, 18, 10), (9, 45, 3)])
def test_generated_puzzles_have_unique_solutions(n, blanks, count):
    questions, solutions = sudoku.generate_puzzles(n, count, blanks, seed=1)
    assert questions.shape == solutions.shape == (count, n * n)
    assert ((questions == 0).sum(axis=1) == blanks).all()
    assert sudoku.valid_solutions_mask(solutions, n).all()
    clues = questions != 0
    assert (questions[clues] == solutions[clues]).all()
    assert all(count_solutions(q, n, limit=2) == 1 for q in questions)


def test_generation_is_seeded_and_distinct_up_to_relabelling():
    a, _ = sudoku.generate_puzzles(4, 50, 9, seed=3)
    b, _ = sudoku.generate_puzzles(4, 50, 9, seed=3)
    c, _ = sudoku.generate_puzzles(4, 50, 9, seed=4)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert len(np.unique(sudoku.canonical_keys(a, 4))) == 50


def test_impossible_blank_count_is_an_error():
    with pytest.raises(DataError, match="blanks=14"):
        sudoku.generate_puzzles(4, 1, 14, seed=0, max_failures=20)
    with pytest.raises(ConfigError, match="blanks=16"):
        sudoku.generate_puzzles(4, 1, 16, seed=0)
    with pytest.raises(ConfigError, match="size=5"):
        sudoku.generate_puzzles(5, 1, 3, seed=0)


def test_is_valid_solution():
    (solution,) = sudoku.generate_puzzles(9, 1, 0, seed=0)[1]
    assert sudoku.is_valid_solution(solution, 9)
    assert sudoku.is_valid_solution(solution.reshape(9, 9), 9)
    broken = solution.copy()
    broken[[0, 1]] = broken[[1, 0]]
    assert not sudoku.is_valid_solution(broken, 9)
    assert not sudoku.is_valid_solution(np.where(np.arange(81) == 5, 0, solution), 9)
    assert not sudoku.is_valid_solution(solution[:80], 9)


def test_canonical_keys_ignore_digit_names():
    questions, _ = sudoku.generate_puzzles(4, 2, 8, seed=0)
    relabelled = np.array([0, 3, 4, 1, 2], np.uint8)[questions]  # swap digits 1<->3, 2<->4
    assert np.array_equal(sudoku.canonical_keys(questions, 4), sudoku.canonical_keys(relabelled, 4))


def test_all_grids_are_every_valid_4x4_board_once():
    grids = sudoku.all_grids(4)
    assert grids.shape == (288, 16)  # the known count of 4x4 Sudoku boards
    assert sudoku.valid_solutions_mask(grids, 4).all()
    assert len({g.tobytes() for g in grids}) == 288
    with pytest.raises(ConfigError, match="size=9"):
        sudoku.all_grids(9)


def test_build_blank_gives_every_board_as_a_label_of_the_blank_input(tmp_path):
    sudoku.build_blank(tmp_path / "blank", size=4, repeats=3)
    train, test = (store.read_split(tmp_path / "blank", split) for split in ("train", "test"))
    assert len(train["labels"]) == 3 * 288 and len(test["labels"]) == 288
    assert (train["inputs"] == sudoku.BLANK_TOKEN).all() and (test["inputs"] == sudoku.BLANK_TOKEN).all()
    assert sudoku.valid_solutions_mask(test["labels"] - 1, 4).all()  # tokens are digits + 1
    assert len({row.tobytes() for row in test["labels"]}) == 288
    with pytest.raises(ConfigError, match="repeats=0"):
        sudoku.build_blank(tmp_path / "none", size=4, repeats=0)


def test_build_generated_writes_disjoint_splits(tmp_path):
    meta = sudoku.build_generated(
        tmp_path / "s4", size=4, num_train=60, num_test=20, blanks=9, seed=0
    )
    assert (meta.vocab_size, meta.seq_len, meta.num_puzzle_identifiers) == (6, 16, 1)
    assert meta.augmentation == "sudoku" and meta.splits["train"].num_rows == 60
    assert meta.build["seed"] == 0 and meta.build["arguments"]["blanks"] == 9
    train, test = (store.read_split(tmp_path / "s4", s) for s in ("train", "test"))
    for split in (train, test):
        assert sudoku.valid_solutions_mask(split["labels"] - 1, 4).all()
        assert ((split["inputs"] == sudoku.BLANK_TOKEN).sum(axis=1) == 9).all()
    train_keys = sudoku.canonical_keys(train["inputs"] - 1, 4)
    assert not np.isin(train_keys, sudoku.canonical_keys(test["inputs"] - 1, 4)).any()


# --- CSV conversion -------------------------------------------------------------------------


def _csv_rows(count: int, seed: int) -> list[tuple[str, str]]:
    questions, solutions = sudoku.generate_puzzles(9, count, 40, seed=seed)
    rows = []
    for i, (q, a) in enumerate(zip(questions, solutions)):
        blank = "." if i % 2 else "0"
        rows.append(("".join(str(d) if d else blank for d in q), "".join(map(str, a))))
    return rows


def _write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    lines = ["source,question,answer,rating"] + [
        f"gen,{q},{a},{i}" for i, (q, a) in enumerate(rows)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def csv_rows():
    return _csv_rows(8, seed=5)


def test_csv_round_trip(tmp_path, csv_rows):
    train_csv = _write_csv(tmp_path / "train.csv", csv_rows[:6])
    test_csv = _write_csv(tmp_path / "test.csv", csv_rows[6:])
    meta = sudoku.build_from_csv(tmp_path / "out", train_csv, test_csv)
    assert meta.splits["train"].num_rows == 6 and meta.splits["test"].num_rows == 2
    assert meta.build["source"]["train_csv"] == str(train_csv.resolve())
    train = store.read_split(tmp_path / "out", "train")
    q, a = csv_rows[0]
    expected_inputs = [1 if ch in ".0" else int(ch) + 1 for ch in q]
    assert train["inputs"][0].tolist() == expected_inputs
    assert train["labels"][0].tolist() == [int(ch) + 1 for ch in a]
    assert train["puzzle_index"].tolist() == list(range(6))


def test_csv_drops_train_rows_seen_in_test(tmp_path, csv_rows):
    q, a = csv_rows[6]
    swap = str.maketrans("12", "21")
    relabelled = (q.translate(swap), a.translate(swap))  # same puzzle, digits 1 and 2 renamed
    train_csv = _write_csv(
        tmp_path / "train.csv", [csv_rows[0], relabelled, csv_rows[1], csv_rows[0]]
    )
    test_csv = _write_csv(tmp_path / "test.csv", csv_rows[6:])
    meta = sudoku.build_from_csv(tmp_path / "out", train_csv, test_csv)
    assert store.read_split(tmp_path / "out", "train")["puzzle_index"].tolist() == [0, 2]
    assert meta.build["arguments"]["train_repeats_dropped"] == 2


def test_csv_subsample_is_seeded(tmp_path, csv_rows):
    train_csv = _write_csv(tmp_path / "train.csv", csv_rows[:6])
    test_csv = _write_csv(tmp_path / "test.csv", csv_rows[6:])
    picks = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        sudoku.build_from_csv(tmp_path / name, train_csv, test_csv, subsample=3, seed=seed)
        picks.append(store.read_split(tmp_path / name, "train")["puzzle_index"].tolist())
    assert len(picks[0]) == 3 and picks[0] == picks[1]
    with pytest.raises(ConfigError, match="subsample=7"):
        sudoku.build_from_csv(tmp_path / "d", train_csv, test_csv, subsample=7)


def _bad_line(q: str, a: str, kind: str) -> str:
    """One CSV line for puzzle (q, a), broken in the way `kind` names."""
    if kind == "columns":
        return f"gen,{q},{a}"
    if kind == "short question":
        return f"gen,{q[1:]},{a},0"
    if kind == "letter":
        return f"gen,x{q[1:]},{a},0"
    if kind == "digit 0 in answer":
        return f"gen,{q},0{a[1:]},0"
    if kind == "contradiction":
        clue = next(i for i, ch in enumerate(q) if ch not in ".0")
        return f"gen,{q[:clue]}{int(q[clue]) % 9 + 1}{q[clue + 1 :]},{a},0"
    assert kind == "rules"
    return f"gen,{'.' * 81},{a[1]}{a[0]}{a[2:]},0"


def _corrupt(rows: list[tuple[str, str]], kind: str) -> str:
    """CSV text whose third data row (line 4) is broken in the way `kind` names."""
    lines = [f"gen,{q},{a},0" for q, a in rows[:5]]
    lines[2] = _bad_line(*rows[2], kind)
    return "\n".join(["source,question,answer,rating", *lines]) + "\n"


@pytest.mark.parametrize(
    "kind,message",
    [
        ("columns", "malformed row"),
        ("short question", "question has 80 characters"),
        ("letter", "question has 'x' at cell 0"),
        ("digit 0 in answer", "answer has '0' at cell 0"),
        ("contradiction", "but the answer has"),
        ("rules", "breaks the Sudoku rules"),
    ],
)
def test_bad_csv_names_file_and_row_and_leaves_nothing(tmp_path, csv_rows, kind, message):
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text(_corrupt(csv_rows, kind))
    test_csv = _write_csv(tmp_path / "test.csv", csv_rows[6:])
    out = tmp_path / "data" / "out"
    with pytest.raises(DataError) as err:
        sudoku.build_from_csv(out, bad_csv, test_csv)
    assert str(bad_csv) in str(err.value) and "row 3 (line 4)" in str(err.value)
    assert message in str(err.value)
    assert not out.exists() and not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


def test_csv_header_and_missing_file(tmp_path, csv_rows):
    no_header = tmp_path / "bad.csv"
    no_header.write_text("source,quiz,answer,rating\ngen,1,2,3\n")
    with pytest.raises(DataError, match=r"bad.csv: missing column\(s\) \['question'\]"):
        sudoku.read_sudoku_csv(no_header)
    with pytest.raises(DataError, match="nope.csv: file not found"):
        sudoku.read_sudoku_csv(tmp_path / "nope.csv")


def test_metadata_is_json(tmp_path):
    sudoku.build_generated(tmp_path / "s", size=4, num_train=5, num_test=2, blanks=6, seed=2)
    raw = json.loads((tmp_path / "s" / "metadata.json").read_text())
    assert raw["task"] == "sudoku" and raw["splits"]["test"]["files"] == ["test/part-00000.parquet"]


def test_1k_setting_subsample_is_stable_and_records_k(tmp_path, csv_rows):
    """The papers' "1k" setting in small: a seeded subsample of N distinct train puzzles, with the
    K augmentations it is meant for recorded in the metadata (and checked by the stream)."""
    import warnings

    from urm_ray.data import stream
    from urm_ray.data.config import DataConfig

    train_csv = _write_csv(tmp_path / "train.csv", csv_rows[:6])
    test_csv = _write_csv(tmp_path / "test.csv", csv_rows[6:])
    picks = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 3)):
        meta = sudoku.build_from_csv(tmp_path / name, train_csv, test_csv, subsample=3, seed=seed,
                                     num_augmentations=101)
        train = store.read_split(tmp_path / name, "train")
        picks[name] = train["puzzle_index"].tolist()
        questions = [csv_rows[i][0] for i in picks[name]]  # rows are the source rows, unchanged
        assert ["".join("." if t == 1 else str(t - 1) for t in row) == q.replace("0", ".")
                for row, q in zip(train["inputs"], questions)] == [True] * 3
    assert picks["a"] == picks["b"] and picks["a"] != picks["c"]
    assert picks["a"] == sorted(set(picks["a"])) and set(picks["a"]) <= set(range(6))
    assert meta.build["arguments"]["num_augmentations"] == 101 and meta.build["seed"] == 3
    with pytest.warns(UserWarning, match="built for 101 augmentations"):
        stream.warn_if_not_intended(DataConfig(path="x", num_augmentations=8), meta)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream.warn_if_not_intended(DataConfig(path="x", num_augmentations=101), meta)
    with pytest.raises(ConfigError, match="num_augmentations=-1"):
        sudoku.build_from_csv(tmp_path / "d", train_csv, test_csv, num_augmentations=-1)


def test_cli_records_num_augmentations(tmp_path):
    from urm_ray.cli import main

    out = tmp_path / "s"
    assert main(["data", "sudoku", "--out", str(out), "--size", "4", "--num-train", "20",
                 "--num-test", "5", "--num-augmentations", "16"]) == 0
    assert store.read_metadata(out).build["arguments"]["num_augmentations"] == 16


def test_csv_streams_in_blocks_with_global_row_numbers(tmp_path, csv_rows, monkeypatch):
    """Small blocks (a few rows each) give the same dataset as one block, and a bad row in a
    later block is named by its row in the file."""
    many = csv_rows[:6] * 3  # 18 rows, repeats dropped by the dedup across blocks
    train_csv = _write_csv(tmp_path / "train.csv", many)
    test_csv = _write_csv(tmp_path / "test.csv", csv_rows[6:])
    sudoku.build_from_csv(tmp_path / "one", train_csv, test_csv, subsample=4, seed=1)
    monkeypatch.setattr(sudoku, "CSV_BLOCK_BYTES", 700)  # about 3 rows per block
    blocks = list(sudoku.iter_sudoku_csv(train_csv, 9, sudoku.CSV_BLOCK_BYTES))
    assert len(blocks) > 3 and [b[0] for b in blocks] == sorted(b[0] for b in blocks)
    meta = sudoku.build_from_csv(tmp_path / "many", train_csv, test_csv, subsample=4, seed=1)
    one, streamed = (store.read_split(tmp_path / d, "train") for d in ("one", "many"))
    assert all(np.array_equal(one[k], streamed[k]) for k in store.COLUMNS)
    assert meta.build["arguments"]["train_repeats_dropped"] == 12
    lines = train_csv.read_text().splitlines()
    lines[14] = _bad_line(*many[13], "letter")  # data row 14, in a later block
    train_csv.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"row 14 \(line 15\): question has 'x' at cell 0"):
        sudoku.build_from_csv(tmp_path / "bad", train_csv, test_csv)
    assert not (tmp_path / "bad").exists()
