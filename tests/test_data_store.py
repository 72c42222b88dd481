"""Dataset folder layout, metadata validation, and the Ray Data stream back to tensors."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from urm_ray.data import originals, store, stream
from urm_ray.data.config import DataConfig
from urm_ray.data.tasks import sudoku
from urm_ray.errors import ConfigError, DataError


def _meta(**overrides) -> store.DatasetMeta:
    fields = {
        "task": "toy",
        "vocab_size": 5,
        "seq_len": 3,
        "num_puzzle_identifiers": 2,
        "augmentation": "none",
    }
    return store.DatasetMeta(**{**fields, **overrides})


def _columns(num_rows: int = 4) -> dict[str, np.ndarray]:
    inputs = np.arange(num_rows * 3).reshape(num_rows, 3) % 5
    return {
        "inputs": inputs,
        "labels": np.where(inputs == 0, -100, inputs),
        "puzzle_identifiers": np.arange(num_rows) % 2,
        "puzzle_index": np.arange(num_rows) + 10,
    }


def test_write_and_read_back(tmp_path):
    meta = store.write_dataset(
        tmp_path / "d", {"train": _columns(5), "test": _columns(2)}, _meta(), rows_per_file=2
    )
    assert meta.splits["train"] == store.SplitInfo(
        5, [f"train/part-0000{i}.parquet" for i in range(3)]
    )
    assert meta.build["urm_ray_version"] and meta.build["time"]
    assert store.read_metadata(tmp_path / "d") == meta
    back = store.read_split(tmp_path / "d", "train")
    for name, column in _columns(5).items():
        assert np.array_equal(back[name], column), name
    assert back["inputs"].dtype == np.int8 and back["inputs"].shape == (5, 3)


def test_write_accepts_lists_and_names_bad_rows(tmp_path):
    cols = _columns(3)
    cols["inputs"] = [list(r) for r in cols["inputs"]]
    store.write_dataset(tmp_path / "ok", {"train": cols}, _meta())
    cols["inputs"][2] = [1, 2]
    with pytest.raises(
        DataError, match=r"split 'train' row 2: inputs has shape \(2,\), expected \(3,\)"
    ):
        store.write_dataset(tmp_path / "bad", {"train": cols}, _meta())
    with pytest.raises(
        DataError, match="split 'test' row 0: labels has length 4, expected seq_len=3"
    ):
        store.write_dataset(
            tmp_path / "bad", {"test": {**_columns(), "labels": np.ones((4, 4), int)}}, _meta()
        )
    labels = _columns()["labels"]
    labels[1, 2] = 5
    with pytest.raises(
        DataError, match=r"split 'x' row 1: labels has value 5 outside \[0, 5\) or -100"
    ):
        store.write_dataset(tmp_path / "bad", {"x": {**_columns(), "labels": labels}}, _meta())
    assert not (tmp_path / "bad").exists()


def test_write_is_atomic(tmp_path, monkeypatch):
    real_convert = store.numpy_to_arrow
    calls = []

    def flaky(cols):  # the second Parquet part fails, after the first was written
        calls.append(cols)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_convert(cols)

    monkeypatch.setattr(store, "numpy_to_arrow", flaky)
    with pytest.raises(OSError, match="disk full"):
        store.write_dataset(tmp_path / "d", {"train": _columns(), "test": _columns()}, _meta())
    assert list(tmp_path.iterdir()) == []


def test_existing_folder_needs_overwrite(tmp_path):
    store.write_dataset(tmp_path / "d", {"train": _columns()}, _meta())
    with pytest.raises(DataError, match="already exists"):
        store.write_dataset(tmp_path / "d", {"train": _columns()}, _meta())
    store.write_dataset(tmp_path / "d", {"test": _columns(2)}, _meta(), overwrite=True)
    assert sorted(store.read_metadata(tmp_path / "d").splits) == ["test"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_overwrite_never_replaces_a_folder_that_is_not_a_dataset(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.tex").write_text("years of work")
    with pytest.raises(DataError, match="is not a urm_ray dataset"):
        store.write_dataset(notes, {"train": _columns()}, _meta(), overwrite=True)
    assert (notes / "thesis.tex").read_text() == "years of work"
    (tmp_path / "empty").mkdir()
    store.write_dataset(tmp_path / "empty", {"train": _columns()}, _meta(), overwrite=True)


def _edit_metadata(folder, edit) -> None:
    path = folder / store.METADATA_FILE
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda m: m.pop("vocab_size"), "missing key 'vocab_size'"),
        (lambda m: m.pop("splits"), "missing key 'splits'"),
        (lambda m: m.update(format_version=99), "format_version=99"),
        (lambda m: m.update(seq_len="81"), "key 'seq_len' must be an int"),
        (lambda m: m.update(task=""), "key 'task' must be a non-empty string"),
        (lambda m: m.update(colour=3), r"unknown key\(s\) \['colour'\]"),
        (lambda m: m["splits"]["train"].pop("num_rows"), "key 'splits.train' must have exactly"),
        (
            lambda m: m["splits"]["train"].update(files=["train/gone.parquet"]),
            "file 'train/gone.parquet'",
        ),
    ],
)
def test_metadata_errors_name_file_and_key(tmp_path, edit, message):
    store.write_dataset(tmp_path / "d", {"train": _columns()}, _meta())
    _edit_metadata(tmp_path / "d", edit)
    with pytest.raises(DataError, match=message) as err:
        store.read_metadata(tmp_path / "d")
    assert str(tmp_path / "d" / "metadata.json") in str(err.value)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda m: m.update(seq_len=81), "column 'inputs' holds 3 tokens per row, but metadata.json says seq_len=81"),
        (lambda m: m.update(vocab_size=3), r"token ids in \[0, 4\], outside metadata.json's vocab_size=3"),
        (lambda m: m["splits"]["train"].update(num_rows=7), "split 'train' has num_rows=7, but its files hold 4"),
    ],
)
def test_metadata_is_checked_against_the_parquet_footers(tmp_path, edit, message):
    store.write_dataset(tmp_path / "d", {"train": _columns()}, _meta())
    _edit_metadata(tmp_path / "d", edit)
    with pytest.raises(DataError, match=message):
        store.read_metadata(tmp_path / "d")


def test_a_truncated_parquet_file_is_named(tmp_path):
    store.write_dataset(tmp_path / "d", {"train": _columns(), "test": _columns(2)}, _meta())
    part = tmp_path / "d" / "test" / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:-20])  # a copy cut short: the footer is gone
    with pytest.raises(DataError, match=f"{part}: not a readable Parquet file"):
        store.read_metadata(tmp_path / "d")


def test_folder_without_metadata(tmp_path):
    with pytest.raises(DataError, match="metadata.json: not found"):
        store.read_metadata(tmp_path)
    (tmp_path / "metadata.json").write_text("{not json")
    with pytest.raises(DataError, match="invalid JSON"):
        store.read_metadata(tmp_path)


def test_data_config_validation():
    with pytest.raises(ConfigError, match="data.num_augmentations=0"):
        DataConfig(path="x", num_augmentations=0)
    with pytest.raises(ConfigError, match="data.shuffle_buffer=-1"):
        DataConfig(path="x", shuffle_buffer=-1)
    with pytest.warns(UserWarning, match="no effect"):
        DataConfig(path="x", augment=False)
    with pytest.raises(ConfigError, match="data.path is empty"):
        stream.load_meta(DataConfig())


# --- Ray Data ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sudoku4(sudoku_data):
    return sudoku_data(num_train=40, num_test=12, blanks=8, seed=0)


def _collect(batches) -> dict[str, torch.Tensor]:
    batches = list(batches)
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}


def test_held_out_originals_are_the_stored_rows_in_batches_shared_by_ranks(sudoku4):
    cfg, meta = DataConfig(path=str(sudoku4)), store.read_metadata(sudoku4)
    rows = originals.read_originals(cfg, meta)
    got = _collect(originals.batches(rows, 5))
    want = store.read_split(sudoku4, "test")
    assert got["inputs"].dtype == torch.int32 and got["labels"].dtype == torch.int64
    assert got["puzzle_identifiers"].dtype == torch.int32 and got["inputs"].shape == (12, 16)
    for name in store.COLUMNS:
        assert np.array_equal(got[name].numpy(), want[name]), name
    assert (got["aug_index"] == 0).all()
    # two ranks: batches 0 and 2 (the last, partial) on rank 0, batch 1 on rank 1
    shares = [[b["puzzle_index"].tolist() for b in originals.batches(rows, 5, rank, 2)] for rank in (0, 1)]
    assert shares == [[want["puzzle_index"][:5].tolist(), want["puzzle_index"][10:].tolist()],
                      [want["puzzle_index"][5:10].tolist()]]
    head = originals.read_originals(cfg, meta, max_rows=7)
    assert np.array_equal(head["inputs"], want["inputs"][:7]) and len(head["labels"]) == 7


def test_held_out_originals_name_a_file_damaged_after_the_metadata_was_read(sudoku4, tmp_path):
    import shutil

    folder = shutil.copytree(sudoku4, tmp_path / "s4")
    meta = store.read_metadata(folder)
    damaged = folder / meta.splits["test"].files[0]
    damaged.write_bytes(damaged.read_bytes()[:40])
    with pytest.raises(DataError, match=f"split 'test', file {damaged}: cannot be read"):
        originals.read_originals(DataConfig(path=str(folder)), meta)


def test_a_small_split_becomes_a_dataset_while_every_cpu_is_taken(ray_local, sudoku4):
    """A small split is read here and described here: building its dataset waits on no Ray task,
    so a trial builds it even when the cluster has no CPU free."""
    import queue
    import threading

    from ray.util.placement_group import placement_group, remove_placement_group

    held = placement_group([{"CPU": ray_local.available_resources()["CPU"]}])
    ray_local.get(held.ready(), timeout=60)
    built: queue.Queue = queue.Queue()
    cfg = DataConfig(path=str(sudoku4), num_augmentations=2)
    try:  # a daemon thread: one stuck waiting for a CPU does not hold the session at its exit
        threading.Thread(target=lambda: built.put(stream.train_dataset(cfg)), daemon=True).start()
        ds = built.get(timeout=30)
    finally:
        remove_placement_group(held)
    assert ds.count() == 40 * 2


def test_train_stream_covers_every_pair_deterministically(ray_local, sudoku4):
    cfg = DataConfig(path=str(sudoku4), num_augmentations=3, shuffle_seed=7)
    ds = stream.train_dataset(cfg)
    first = _collect(stream.iter_torch_batches(ds, 16, epoch=0, seed=1))
    again = _collect(stream.iter_torch_batches(ds, 16, epoch=0, seed=1))
    later = _collect(stream.iter_torch_batches(ds, 16, epoch=1, seed=1))
    pairs = set(zip(first["puzzle_index"].tolist(), first["aug_index"].tolist()))
    assert pairs == {(p, a) for p in range(40) for a in range(3)} and len(first["inputs"]) == 120
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["puzzle_index"], later["puzzle_index"])
    originals = store.read_split(sudoku4, "train")
    is_original = first["aug_index"] == 0
    rows = first["puzzle_index"][is_original].numpy()
    assert np.array_equal(first["inputs"][is_original].numpy(), originals["inputs"][rows])
    assert sudoku.valid_solutions_mask(first["labels"].numpy() - 1, 4).all()


def test_train_stream_without_augmentation(ray_local, sudoku4):
    cfg = DataConfig(path=str(sudoku4), augment=False, num_augmentations=1)
    got = _collect(stream.iter_torch_batches(stream.train_dataset(cfg), 64, shuffle=False))
    want = store.read_split(sudoku4, "train")
    order = np.argsort(got["puzzle_index"].numpy())
    assert np.array_equal(got["inputs"].numpy()[order], want["inputs"])
    with pytest.raises(DataError, match="no split 'valid'"):
        originals.read_originals(dataclasses.replace(cfg, eval_split="valid"), store.read_metadata(sudoku4))


def test_chunked_write_rolls_parts_and_counts_rows_across_chunks(tmp_path):
    def chunks(bad_at=None):
        for start in (0, 3, 6):
            cols = _columns(3)
            cols["puzzle_index"] = np.arange(start, start + 3)
            if start == bad_at:
                cols["inputs"][1, 0] = 9
            yield cols

    meta = store.write_dataset_chunks(tmp_path / "d", {"train": chunks()}, _meta(), rows_per_file=4)
    assert meta.splits["train"].num_rows == 9 and len(meta.splits["train"].files) == 3
    assert store.read_split(tmp_path / "d", "train")["puzzle_index"].tolist() == list(range(9))
    with pytest.raises(DataError, match="split 'train' row 7: inputs has value 9"):
        store.write_dataset_chunks(tmp_path / "e", {"train": chunks(bad_at=6)}, _meta())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_the_streams_map_tasks_import_no_torch():
    """Ray Data runs the augmentation in fresh worker processes that import this module and every
    task's registry entry: torch (about 2 s of CPU each) stays out until a batch becomes tensors."""
    import subprocess
    import sys

    code = ("import sys; from urm_ray.data import stream; from urm_ray.data.tasks import registry\n"
            "assert len(registry.TASKS) >= 5\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
