"""Graph colouring: planted-colouring generator, token layout, builder and augmentation."""

import numpy as np
import pytest

from urm_ray.cli import main
from urm_ray.data import augment, store
from urm_ray.data.tasks import coloring
from urm_ray.errors import ConfigError, DataError

N, K = 8, 3


def _decode(inputs: np.ndarray, labels: np.ndarray, n: int):
    """(adjacency [n, n] bool, colours [n]) read back from one row, by plain indexing."""
    rows_in, rows_lab = inputs.reshape(n, n + 1), labels.reshape(n, n + 1)
    return rows_in[:, 1:] == coloring.EDGE_TOKEN, rows_lab[:, 0] - coloring.COLOR0_TOKEN


def _proper(adjacency: np.ndarray, colours: np.ndarray) -> bool:
    n = len(colours)
    return all(colours[i] != colours[j] for i in range(n) for j in range(n) if adjacency[i, j])


def _generate(count=40, seed=0, n=N, colors=K, edge_prob=0.5):
    chunks = list(coloring.generate_graphs(n, count, colors=colors, edge_prob=edge_prob, seed=seed))
    return np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks])


def test_labels_are_proper_colourings_of_well_formed_graphs():
    inputs, labels = _generate()
    assert inputs.shape == labels.shape == (40, N * (N + 1))
    for x, y in zip(inputs, labels):
        adjacency, colours = _decode(x, y, N)
        assert (adjacency == adjacency.T).all() and not adjacency.diagonal().any()
        assert _proper(adjacency, colours)
        assert sorted(np.bincount(colours, minlength=K)) == [2, 3, 3]  # balanced, all k used
        rows = x.reshape(N, N + 1)
        assert (rows[:, 0] == coloring.BLANK_TOKEN).all()
        assert (y.reshape(N, N + 1)[:, 1:] == coloring.IGNORE_LABEL).all()
    assert inputs.reshape(-1, N, N + 1)[:, :, 1:].max() == coloring.EDGE_TOKEN  # there are edges
    assert coloring.valid_colorings_mask(labels, inputs, N).all()


def test_generation_is_seeded_and_distinct():
    a, _ = _generate(seed=1)
    b, _ = _generate(seed=1)
    c, _ = _generate(seed=2)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert len({x.tobytes() for x in a}) == len(a)


def test_too_few_distinct_graphs_is_an_error():
    # 2 nodes, 2 colours: the only graphs are "edge" and "no edge"
    with pytest.raises(DataError, match="only 2/5 distinct graphs"):
        list(coloring.generate_graphs(2, 5, colors=2, edge_prob=0.5, max_candidates=200))
    for kwargs, word in (({"colors": 1}, "colors=1"), ({"colors": 9}, "colors=9"),
                         ({"edge_prob": 0.0}, "edge_prob=0.0")):
        with pytest.raises(ConfigError, match=word):
            list(coloring.generate_graphs(N, 1, **{"colors": K, "edge_prob": 0.5, **kwargs}))
    with pytest.raises(ConfigError, match="seq_len=10 is not n"):
        coloring.num_nodes(10)
    assert coloring.num_nodes(N * (N + 1)) == N


def test_augmentation_renames_nodes_and_colours_and_stays_proper():
    inputs, labels = _generate(count=16, seed=3)
    index = np.arange(16)
    aug_in, aug_lab = augment.augment_batch(coloring.augment, inputs, labels, index, index * 0 + 1, 0)
    assert coloring.valid_colorings_mask(aug_lab, aug_in, N).all()
    assert not np.array_equal(aug_in, inputs) and not np.array_equal(aug_lab, labels)
    colour_changed = 0
    for x, y, ax, ay in zip(inputs, labels, aug_in, aug_lab):
        adjacency, colours = _decode(x, y, N)
        aug_adjacency, aug_colours = _decode(ax, ay, N)
        assert _proper(aug_adjacency, aug_colours)
        assert aug_adjacency.sum() == adjacency.sum()  # same graph, nodes renamed
        assert sorted(aug_adjacency.sum(axis=1)) == sorted(adjacency.sum(axis=1))
        assert sorted(np.bincount(aug_colours, minlength=K)) == sorted(np.bincount(colours,
                                                                                  minlength=K))
        assert aug_colours.max() < K  # colours stay inside the palette
        colour_changed += not np.array_equal(np.bincount(aug_colours, minlength=K),
                                             np.bincount(colours, minlength=K))
    assert colour_changed > 0  # the colour names were permuted, not only the nodes
    for ax, ay in zip(aug_in, aug_lab):  # no givens: colours named by first use over the nodes
        _, aug_colours = _decode(ax, ay, N)
        first_uses = [int(c) for i, c in enumerate(aug_colours) if c not in aug_colours[:i]]
        assert first_uses == list(range(len(first_uses)))
    again = augment.augment_batch(coloring.augment, inputs, labels, index, index * 0 + 1, 0)
    assert np.array_equal(again[0], aug_in) and np.array_equal(again[1], aug_lab)


def test_augmentation_renames_given_colours_at_random():
    inputs, labels = _generate(count=64, seed=4)
    inputs = inputs.copy()
    inputs[:, (N - 1) * (N + 1)] = labels[:, (N - 1) * (N + 1)]  # the last node's colour given
    index = np.arange(64)
    aug_in, aug_lab = augment.augment_batch(coloring.augment, inputs, labels, index, index * 0 + 1, 0)
    assert coloring.valid_colorings_mask(aug_lab, aug_in, N).all()  # givens kept, renamed alike
    not_first_use = 0
    for ax, ay in zip(aug_in, aug_lab):
        _, aug_colours = _decode(ax, ay, N)
        first_uses = [int(c) for i, c in enumerate(aug_colours) if c not in aug_colours[:i]]
        not_first_use += first_uses != list(range(len(first_uses)))
    assert not_first_use > 0  # with a given colour the names stay a random renaming


def test_build_and_cli(tmp_path, capsys):
    meta = coloring.build_generated(tmp_path / "c", n=N, colors=K, num_train=30, num_test=10,
                                    edge_prob=0.5, seed=0)
    assert (meta.task, meta.vocab_size, meta.seq_len, meta.augmentation) == (
        "coloring", 4 + K, N * (N + 1), "coloring")
    train, test = (store.read_split(tmp_path / "c", s) for s in ("train", "test"))
    assert len(train["inputs"]) == 30 and len(test["inputs"]) == 10
    assert not {x.tobytes() for x in train["inputs"]} & {x.tobytes() for x in test["inputs"]}
    assert coloring.valid_colorings_mask(train["labels"], train["inputs"], N).all()
    out = tmp_path / "cli"
    assert main(["data", "coloring", "--out", str(out), "--nodes", "6", "--colors", "2",
                 "--num-train", "5", "--num-test", "2"]) == 0
    assert store.read_metadata(out).seq_len == 42
    assert main(["data", "coloring", "--out", str(tmp_path / "bad"), "--colors", "1"]) == 2
    assert "colors=1" in capsys.readouterr().err and not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_ray_stream_augments_graphs_validly(ray_local, tmp_path):
    import torch

    from urm_ray.data import stream
    from urm_ray.data.config import DataConfig

    coloring.build_generated(tmp_path / "c", n=N, colors=K, num_train=10, num_test=2, seed=1)
    ds = stream.train_dataset(DataConfig(path=str(tmp_path / "c"), num_augmentations=4))
    batches = list(stream.iter_torch_batches(ds, 16, shuffle=False))
    inputs, labels = (torch.cat([b[k] for b in batches]).numpy() for k in ("inputs", "labels"))
    assert len(inputs) == 40 and (labels.reshape(-1, N, N + 1)[:, :, 1:] == -100).all()
    assert coloring.valid_colorings_mask(labels, inputs, N).all()
    assert len({x.tobytes() for x in inputs}) > 10


def test_nearest_finds_a_proper_colouring_at_the_least_distance():
    n = 6
    inputs, labels = _generate(count=24, seed=5, n=n)
    inputs = inputs.copy()
    inputs[:4, 0] = labels[:4, 0]  # node 0's colour given in the first four graphs
    answers = labels.copy()
    answers[:, 0 :: n + 1] = coloring.COLOR0_TOKEN + np.random.default_rng(1).integers(0, K, (24, n))
    answers[5] = labels[5]  # already the label: kept
    search = coloring.nearest(n * (n + 1), coloring.COLOR0_TOKEN + K)
    targets = search(answers, inputs, labels)
    assert coloring.valid_colorings_mask(targets, inputs, n).all()
    assert (targets.reshape(24, n, n + 1)[:, :, 1:] == coloring.IGNORE_LABEL).all()  # adjacency ignored
    assert np.array_equal(targets[5], labels[5])
    every = np.array(np.meshgrid(*[np.arange(K)] * n, indexing="ij")).reshape(n, -1).T  # [K^n, n]
    for x, y, a, t in zip(inputs, labels, answers, targets):
        adjacency, _ = _decode(x, y, n)
        given = x.reshape(n, n + 1)[:, 0] - coloring.COLOR0_TOKEN
        proper = [c for c in every if _proper(adjacency, c) and all(g < 0 or g == v for g, v in zip(given, c))]
        distance = lambda c: int((c != a.reshape(n, n + 1)[:, 0] - coloring.COLOR0_TOKEN).sum())  # noqa: E731
        assert distance(t.reshape(n, n + 1)[:, 0] - coloring.COLOR0_TOKEN) == min(map(distance, proper))


def test_nearest_refuses_a_search_too_large_and_tasks_without_one():
    from urm_ray.data.tasks.verify import nearest_for

    with pytest.raises(ConfigError, match=r"3\^12 colourings .* over 100,000"):
        coloring.nearest(12 * 13, coloring.COLOR0_TOKEN + 3)
    with pytest.raises(ConfigError, match="task 'maze' has no search .* tasks with one: \\['coloring', 'nqueens', 'sudoku'\\]"):
        nearest_for("maze", 900, 6)
    torch = pytest.importorskip("torch")
    inputs, labels = _generate(count=4, seed=2)
    search = nearest_for("coloring", N * (N + 1), coloring.COLOR0_TOKEN + K)
    same = search(torch.from_numpy(labels), torch.from_numpy(inputs), torch.from_numpy(labels))
    assert same.dtype == torch.int16 and np.array_equal(same.numpy(), labels)
