"""Maze generator, hardness filter, dataset builder and dihedral augmentation, checked against an
independent breadth-first search written here."""

from collections import deque

import numpy as np
import pytest

from urm_ray.cli import main
from urm_ray.data import augment, store
from urm_ray.data.tasks import maze
from urm_ray.errors import ConfigError, DataError

N = 11


def _reference_bfs(grid: np.ndarray, start: tuple, passable) -> dict:
    """Distances from `start` over cells where passable(token) holds (plain deque BFS)."""
    n = grid.shape[0]
    dist, queue = {start: 0}, deque([start])
    while queue:
        r, c = queue.popleft()
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if 0 <= nr < n and 0 <= nc < n and (nr, nc) not in dist and passable(grid[nr, nc]):
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist


def _count_shortest(grid: np.ndarray, start: tuple, goal: tuple) -> int:
    dist = _reference_bfs(grid, start, lambda t: t != maze.WALL_TOKEN)
    ways = {start: 1}
    for cell in sorted(dist, key=dist.get)[1:]:
        r, c = cell
        ways[cell] = sum(ways.get(nb, 0) for nb in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1))
                         if dist.get(nb) == dist[cell] - 1)
    return ways[goal]


def _check_label(inputs: np.ndarray, labels: np.ndarray, n: int) -> int:
    """Asserts that `labels` marks a true shortest path of maze `inputs`; returns its length."""
    grid, answer = inputs.reshape(n, n), labels.reshape(n, n)
    start = tuple(np.argwhere(grid == maze.START_TOKEN)[0])
    goal = tuple(np.argwhere(grid == maze.GOAL_TOKEN)[0])
    shortest = _reference_bfs(grid, start, lambda t: t != maze.WALL_TOKEN)[goal]
    path = answer == maze.PATH_TOKEN
    assert (answer[~path] == grid[~path]).all() and (grid[path] == maze.OPEN_TOKEN).all()
    assert path.sum() == shortest - 1
    walk = _reference_bfs(answer, start, lambda t: t in (maze.PATH_TOKEN, maze.GOAL_TOKEN))
    assert walk[goal] == shortest  # the marked cells connect start to goal
    return shortest


def _generate(count=12, seed=0, **kwargs):
    keep = maze.Filter(**{"min_path": 20, **kwargs})
    chunks = list(maze.generate_mazes(N, count, keep, seed=seed))
    return np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks])


def test_labels_are_unique_shortest_paths_within_the_hardness_filter():
    inputs, labels = _generate(count=12, min_path=20, max_path=30)
    assert inputs.shape == labels.shape == (12, N * N) and inputs.dtype == np.uint8
    for x, y in zip(inputs, labels):
        assert 20 <= _check_label(x, y, N) <= 30
        grid = x.reshape(N, N)
        assert (grid == maze.START_TOKEN).sum() == 1 and (grid == maze.GOAL_TOKEN).sum() == 1
        start, goal = (tuple(np.argwhere(grid == t)[0]) for t in (maze.START_TOKEN, maze.GOAL_TOKEN))
        assert _count_shortest(grid, start, goal) == 1
    assert maze.valid_paths_mask(labels, inputs, N).all()


def test_without_unique_filter_labels_are_still_shortest():
    inputs, labels = _generate(count=8, min_path=4, loop_prob=0.5, unique_path=False, seed=3)
    lengths = [_check_label(x, y, N) for x, y in zip(inputs, labels)]
    assert min(lengths) >= 4
    grids = inputs.reshape(-1, N, N)
    counts = [_count_shortest(g, tuple(np.argwhere(g == 3)[0]), tuple(np.argwhere(g == 4)[0]))
              for g in grids]
    assert max(counts) > 1  # many loops: some mazes have several shortest paths


def test_generation_is_seeded_and_distinct_up_to_symmetry():
    a, _ = _generate(seed=5)
    b, _ = _generate(seed=5)
    c, _ = _generate(seed=6)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    keys = {maze._dihedral_key(x.reshape(N, N)) for x in a}
    assert len(keys) == len(a)
    assert maze._dihedral_key(np.rot90(a[0].reshape(N, N))) == maze._dihedral_key(a[0].reshape(N, N))


def test_impossible_filter_gives_up_with_the_numbers():
    # a 5x5 corridor maze has 9 rooms: no path is longer than 16 moves
    with pytest.raises(DataError, match=r"0/2 mazes passed the filter.*min_path=20"):
        list(maze.generate_mazes(5, 2, maze.Filter(min_path=20), max_candidates=512))
    for kwargs, word in (({"min_path": 5, "max_path": 3}, "max_path=3"),
                         ({"min_path": 5, "loop_prob": 1.5}, "loop_prob=1.5"),
                         ({"min_path": 999}, "min_path=999")):
        with pytest.raises(ConfigError, match=word):
            list(maze.generate_mazes(N, 1, maze.Filter(**kwargs)))


def test_build_writes_splits_and_keeps_the_test_split_stable(tmp_path):
    meta = maze.build_generated(tmp_path / "a", N, num_train=7, num_test=5, keep=maze.Filter(min_path=16), seed=1)
    assert (meta.task, meta.vocab_size, meta.seq_len, meta.augmentation) == ("maze", 6, N * N,
                                                                            "dihedral")
    assert meta.build["arguments"]["min_path"] == 16
    test = store.read_split(tmp_path / "a", "test")
    train = store.read_split(tmp_path / "a", "train")
    assert len(test["inputs"]) == 5 and train["puzzle_index"].tolist() == list(range(7))
    for split in (train, test):
        assert maze.valid_paths_mask(split["labels"], split["inputs"], N).all()
    maze.build_generated(tmp_path / "b", N, num_train=2, num_test=5, keep=maze.Filter(min_path=16), seed=1)
    assert np.array_equal(store.read_split(tmp_path / "b", "test")["inputs"], test["inputs"])
    keys = lambda s: {maze._dihedral_key(x.reshape(N, N)) for x in s["inputs"]}  # noqa: E731
    assert not keys(train) & keys(test)


def test_failed_build_leaves_nothing(tmp_path):
    with pytest.raises(DataError, match="passed the filter"):
        maze.build_generated(tmp_path / "m", 5, num_train=1, num_test=1,
                            keep=maze.Filter(min_path=20))
    assert list(tmp_path.iterdir()) == []


def test_dihedral_augmentation_moves_maze_and_path_together():
    inputs, labels = _generate(count=6, seed=2)
    index = np.arange(6)
    aug_in, aug_lab = augment.augment_batch(augment.dihedral, inputs, labels, index, index * 0 + 1, 0)
    assert maze.valid_paths_mask(aug_lab, aug_in, N).all()
    for x, y in zip(aug_in, aug_lab):
        _check_label(x, y, N)
    assert not (aug_in == inputs).all(axis=1).any()  # never the identity (mazes have no symmetry)
    originals = {x.tobytes() for x in inputs}
    views = {np.ascontiguousarray(np.rot90(x.reshape(N, N), k)).tobytes()
             for x in aug_in for k in range(4)} | {
        np.ascontiguousarray(np.rot90(x.reshape(N, N), k).T).tobytes()
        for x in aug_in for k in range(4)}
    assert originals <= views  # each augmented maze is a rotation / reflection of its original


def test_dihedral_sources_are_the_eight_symmetries():
    sources = augment.dihedral_sources(4)
    assert sources.shape == (8, 16) and np.array_equal(sources[0], np.arange(16))
    assert len({s.tobytes() for s in sources}) == 8
    assert all(sorted(s) == list(range(16)) for s in sources)
    board = np.arange(16).reshape(4, 4)
    assert np.array_equal(board.reshape(-1)[sources[1]], np.rot90(board).reshape(-1))
    assert np.array_equal(board.reshape(-1)[sources[4]], board.T.reshape(-1))


def test_cli_builds_a_maze_dataset(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["data", "maze", "--out", str(out), "--size", "9", "--num-train", "3",
                 "--num-test", "2", "--min-path", "10"]) == 0
    meta = store.read_metadata(out)
    assert meta.splits["train"].num_rows == 3 and meta.seq_len == 81
    assert main(["data", "maze", "--out", str(tmp_path / "x"), "--size", "9",
                 "--min-path", "5", "--max-path", "2"]) == 2
    assert "max_path=2" in capsys.readouterr().err


# --- CSV conversion (the official data's layout) ----------------------------------------------


def _csv_text(inputs: np.ndarray, labels: np.ndarray, edit=None) -> str:
    rows = []
    for i, (x, y) in enumerate(zip(inputs, labels)):
        q, a = ("".join(maze.CHARSET[t - 1] for t in g) for g in (x, y))
        if edit and i == 1:
            q, a = edit(q, a)
        rows.append(f"gen,{q},{a},0")
    return "\n".join(["source,question,answer,rating", *rows]) + "\n"


@pytest.fixture(scope="module")
def small_mazes():
    return _generate(count=4, seed=9)


def test_csv_round_trip(tmp_path, small_mazes):
    inputs, labels = small_mazes
    (tmp_path / "train.csv").write_text(_csv_text(inputs[:3], labels[:3]))
    (tmp_path / "test.csv").write_text(_csv_text(inputs[3:], labels[3:]))
    assert main(["data", "maze", "--out", str(tmp_path / "d"), "--train-csv",
                 str(tmp_path / "train.csv"), "--test-csv", str(tmp_path / "test.csv")]) == 0
    train = store.read_split(tmp_path / "d", "train")
    assert np.array_equal(train["inputs"], inputs[:3]) and np.array_equal(train["labels"], labels[:3])
    assert store.read_metadata(tmp_path / "d").build["builder"] == "maze.build_from_csv"


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda q, a: (q.replace("#", "x", 1), a), "question has 'x' at cell"),
        (lambda q, a: (q[1:], a), f"question has {N * N - 1} characters, expected {N * N}"),
        (lambda q, a: (q.replace("S", " "), a.replace("S", " ")), "question has 0 start 'S'"),
        (lambda q, a: (q, a.replace("o", " ", 1)), "answer is not a shortest path"),
        (lambda q, a: (q, a.replace("#", "o", 1)), "answer has 'o' at cell"),
        (lambda q, a: (q.replace(" ", "o", 1), a), "question has 'o' at cell"),
    ],
)
def test_bad_csv_names_file_row_and_value_and_leaves_nothing(tmp_path, small_mazes, edit, message):
    inputs, labels = small_mazes
    bad = tmp_path / "bad.csv"
    bad.write_text(_csv_text(inputs, labels, edit))
    (tmp_path / "test.csv").write_text(_csv_text(inputs[:1], labels[:1]))
    with pytest.raises(DataError) as err:
        maze.build_from_csv(tmp_path / "out", bad, tmp_path / "test.csv")
    assert f"{bad}: row 2 (line 3)" in str(err.value) and message in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "test.csv"]


@pytest.mark.slow
def test_ray_stream_augments_mazes_validly(ray_local, tmp_path):
    import torch

    from urm_ray.data import stream
    from urm_ray.data.config import DataConfig

    maze.build_generated(tmp_path / "m", N, num_train=6, num_test=2, keep=maze.Filter(min_path=16), seed=2)
    ds = stream.train_dataset(DataConfig(path=str(tmp_path / "m"), num_augmentations=8))
    batches = list(stream.iter_torch_batches(ds, 16, shuffle=False))
    inputs, labels = (torch.cat([b[k] for b in batches]).numpy() for k in ("inputs", "labels"))
    aug = torch.cat([b["aug_index"] for b in batches]).numpy()
    assert len(inputs) == 48 and sorted(set(aug.tolist())) == list(range(8))
    assert maze.valid_paths_mask(labels, inputs, N).all()  # by BFS, independent of the labels
    assert len({x.tobytes() for x in inputs}) > 6  # the augmentations differ from the originals
