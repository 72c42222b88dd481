"""Ray Data pipeline from a dataset folder to training batches (the only module that imports ray.data).

    split files -> the object store, once    stored originals: read on the driver and put there
           with from_blocks when small (milliseconds), else read_parquet(...).materialize()
      -> map_batches(pyarrow -> numpy, expand, augment)      re-executed on every pass (epoch)
           each puzzle becomes `num_augmentations` rows (aug index 0 = original), augmented with the
           task's augmentation (`tasks.registry`), deterministic per (puzzle_index, aug_index,
           shuffle_seed), and put in a seeded order inside the block
    tasks with versions (ARC) instead: range(blocks) -> map_batches(a block of aug indices applied
           to every stored pair by the task's `Versions.augment`): one version per (task, aug
           index), one puzzle identifier per version
      -> iter_torch_batches(local shuffle seeded by (seed, epoch))

Batches are dicts of tensors: inputs int32 [B, L], labels int64 [B, L], puzzle_identifiers int32
[B], plus puzzle_index int64 [B] and aug_index int32 [B] to trace each row to its source
(``store.BATCH_DTYPES``). Evaluation reads its split's originals without Ray (``originals``).

Row order is deterministic given the seeds when the dataset executes with `preserve_order`
(set on the datasets built here; pass `ingest_options()` to Ray Train's `DataConfig`, which
otherwise replaces them with the driver's DataContext defaults). Row contents are deterministic
in any case.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray.data
from ray.data.collate_fn import NumpyBatchCollateFn

from urm_ray.data.augment import TransformFn, augment_batch
from urm_ray.data.config import DataConfig
from urm_ray.data.store import (
    BATCH_DTYPES,
    METADATA_FILE,
    DatasetMeta,
    arrow_to_numpy,
    read_metadata,
    read_split,
    split_files,
    split_paths,
)
from urm_ray.data.tasks import registry
from urm_ray.data.tasks.task import PuzzleTask, Versions
from urm_ray.errors import ConfigError, DataError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("urm_ray.data")

# Puzzles per map_batches call; each call's rows are put in a seeded random order.
MAP_BATCH_PUZZLES = 4096
# Ray merges a task's outputs into blocks up to this size before passing them on; with Ray's much
# larger default the first training batch waits for a whole block of augmented rows
# (docs/experiments/data-choices.md).
BLOCK_BYTES = 8 * 2**20
# Splits up to this size, local or on S3, are read by the process that builds the datasets (the
# driver, or a sweep's trial actor) with pyarrow and handed to Ray as Arrow tables, far cheaper for
# a small split than starting Ray's read tasks (docs/experiments/data-choices.md); larger ones are
# read by Ray's parallel read tasks.
DRIVER_READ_BYTES = 256 * 2**20
# tasks with versions: augmented rows per map task (a block of aug indices times every stored pair)
VERSION_ROWS_PER_BLOCK = 16384


def load_meta(cfg: DataConfig) -> DatasetMeta:
    """The validated metadata of `cfg.path`, its task and augmentation known to the registry."""
    if not cfg.path:
        raise ConfigError("data.path is empty; expected a dataset folder with metadata.json")
    if "://" not in cfg.path and not (Path(cfg.path) / METADATA_FILE).is_file():
        raise DataError(missing_dataset(cfg.path))
    meta = read_metadata(cfg.path)
    registry.of(meta, f"{cfg.path}/{METADATA_FILE}")
    return meta


def missing_dataset(path: str) -> str:
    """What to do about a data.path that holds no dataset: the command that builds one there (its
    task guessed from the folder's name, e.g. sudoku4 -> sudoku), or a built-in dataset."""
    name = Path(path).name.lower()
    task = next((t for t in registry.TASKS if t in name), "<task>")
    return (f"data.path={path}: no dataset there ({Path(path) / METADATA_FILE} not found). Build one "
            f"with `urm-ray data {task} --out {path} ...` (tasks: {', '.join(registry.TASKS)}; "
            f"`urm-ray data {task} --help` lists the options), or train on a built-in one, e.g. "
            "data.path=builtin:sudoku4")


def puzzle_table_size(meta: DatasetMeta, cfg: DataConfig) -> int:
    """Rows of the model's puzzle-embedding table for this dataset and data config: the metadata's
    count, or a row per task version for a task with versions (``PuzzleTask.embedding_rows``)."""
    return registry.of(meta).embedding_rows(meta.num_puzzle_identifiers, cfg.augmentation_slots())


def ingest_options() -> ray.data.ExecutionOptions:
    """Execution options for `ray.train.DataConfig(execution_options=...)`: keep block order."""
    return ray.data.ExecutionOptions(preserve_order=True)


def _read_split(cfg: DataConfig, meta: DatasetMeta, split: str) -> ray.data.Dataset:
    """The stored rows of `split`, read once into the object store (one block per file).

    Materialized because every pass (epoch) re-executes the whole pipeline, and listing and
    reading the files cost seconds per pass, longer than a pass over a small dataset takes."""
    fs, files = split_files(cfg.path, meta, split)
    small = sum(info.size for info in fs.get_file_info(files)) <= DRIVER_READ_BYTES
    if small:
        # from_blocks describes the tables here; from_arrow would run a Ray task for it and wait
        # for a worker process to start (seconds on a busy node) before the dataset exists
        ds = ray.data.from_blocks([pq.read_table(f, filesystem=fs) for f in files])
    else:
        ds = ray.data.read_parquet(split_paths(cfg.path, meta, split), file_extensions=None)
    ds.context.execution_options.preserve_order = True
    ds.context.target_max_block_size = BLOCK_BYTES
    ds.context.enable_progress_bars = False  # one bar per epoch and split floods training logs
    return ds if small else ds.materialize()


def _expand_augment(
    table: pa.Table, augment: TransformFn | None, num_augmentations: int, seed: int
) -> dict[str, np.ndarray]:
    """Stored rows -> `num_augmentations` augmented rows each, in a seeded order in the batch."""
    cols = arrow_to_numpy(table)
    num_puzzles, k = len(table), num_augmentations
    first = int(cols["puzzle_index"][0]) if num_puzzles else 0
    order = np.random.default_rng([seed, first, num_puzzles]).permutation(num_puzzles * k)  # [N*K]
    rows = order // k  # [N*K] source row of each output row
    aug_index = (order % k).astype(np.int32)  # [N*K]
    puzzle_index = cols["puzzle_index"][rows]
    inputs, labels = cols["inputs"][rows], cols["labels"][rows]
    if augment is not None:
        inputs, labels = augment_batch(augment, inputs, labels, puzzle_index, aug_index, seed)
    return {
        "inputs": inputs,  # [N*K, L]
        "labels": labels,  # [N*K, L]
        "puzzle_identifiers": cols["puzzle_identifiers"][rows],  # [N*K]
        "puzzle_index": puzzle_index,  # [N*K]
        "aug_index": aug_index,  # [N*K]
    }


def _aug_blocks(num_augmentations: int, per_block: int, seed: int) -> list[np.ndarray]:
    """Aug indices 0..K-1 in a seeded order, cut into blocks of `per_block`."""
    order = np.random.default_rng([seed, num_augmentations]).permutation(num_augmentations)
    return [order[i : i + per_block] for i in range(0, num_augmentations, per_block)]


def _augment_version_block(
    batch: dict[str, np.ndarray], stored: dict[str, np.ndarray], num_augmentations: int,
    per_block: int, seed: int, versions: Versions, prepared: Any, translate: bool,
) -> dict[str, np.ndarray]:
    """One block of aug indices applied to every stored row, in a seeded order."""
    block = int(batch["id"][0])
    augs = _aug_blocks(num_augmentations, per_block, seed)[block]
    n = len(stored["inputs"])
    order = np.random.default_rng([seed, block]).permutation(n * len(augs))  # [N*A]
    rows, aug_index = order // len(augs), augs[order % len(augs)].astype(np.int32)
    picked = {key: column[rows] for key, column in stored.items()}
    inputs, labels, identifiers = versions.augment(
        picked, aug_index, seed, prepared, num_augmentations, translate)
    return {"inputs": inputs, "labels": labels, "puzzle_identifiers": identifiers,
            "puzzle_index": picked["puzzle_index"], "aug_index": aug_index}


def _versions_train_dataset(cfg: DataConfig, versions: Versions) -> ray.data.Dataset:
    """Training rows of a task with versions, aug-index-major: the stored pairs are few (ARC:
    thousands) and K large (1000 in the papers), so each map task applies a block of aug indices
    to every stored pair; the stream then mixes all tasks from the first batch on."""
    stored = read_split(cfg.path, "train")
    prepared = versions.prepare(cfg.path, cfg.num_augmentations)
    per_block = max(1, VERSION_ROWS_PER_BLOCK // max(len(stored["inputs"]), 1))
    num_blocks = len(_aug_blocks(cfg.num_augmentations, per_block, cfg.shuffle_seed))
    ds = ray.data.range(num_blocks, override_num_blocks=num_blocks)
    ds.context.execution_options.preserve_order = True
    ds.context.target_max_block_size = BLOCK_BYTES
    ds.context.enable_progress_bars = False
    kwargs = {"stored": stored, "num_augmentations": cfg.num_augmentations,
              "per_block": per_block, "seed": cfg.shuffle_seed, "versions": versions,
              "prepared": prepared, "translate": cfg.translate is not False}  # auto translates
    return ds.map_batches(_augment_version_block, batch_size=1, fn_kwargs=kwargs)


def warn_if_not_intended(cfg: DataConfig, meta: DatasetMeta) -> None:
    """Warns when the dataset records the K it was built for (e.g. 1001 for the papers' "1k"
    setting) and `data.num_augmentations` streams another number."""
    intended = meta.build.get("arguments", {}).get("num_augmentations", 0)
    if cfg.augment and intended and intended != cfg.num_augmentations:
        warnings.warn(
            f"{cfg.path} was built for {intended} augmentations per puzzle"
            f" (metadata build.arguments.num_augmentations); data.num_augmentations="
            f"{cfg.num_augmentations} streams a different number",
            stacklevel=3,
        )


def warn_unused(cfg: DataConfig, meta: DatasetMeta) -> None:
    """Data keys that this dataset gives no effect; the driver calls it where it reads the
    metadata, once per run."""
    if cfg.translate is True and not registry.of(meta).translates:
        warnings.warn(f"data.translate=true has no effect on {meta.task} data: only ARC grids are "
                      "translated on the canvas", stacklevel=2)


def _row_augmentation(cfg: DataConfig, meta: DatasetMeta, task: PuzzleTask) -> TransformFn | None:
    """The per-row augmentation the stream applies: the task's, unless data.augment is off or the
    dataset records none."""
    if not cfg.augment:
        return None
    if meta.augmentation == "none" or task.augment is None:
        if cfg.num_augmentations > 1:
            warnings.warn(
                f"{cfg.path} has no augmentation: data.num_augmentations={cfg.num_augmentations}"
                " repeats each puzzle unchanged",
                stacklevel=3,
            )
        return None
    return task.augment


def train_dataset(cfg: DataConfig, meta: DatasetMeta | None = None) -> ray.data.Dataset:
    """The training split; one pass yields every (puzzle, aug index) pair once. ``meta``: the
    metadata the driver read (None: read it from ``cfg.path`` here)."""
    meta = meta or load_meta(cfg)
    task = registry.of(meta)
    if cfg.augment and task.versions is not None:
        return _versions_train_dataset(cfg, task.versions)
    kwargs = {
        "augment": _row_augmentation(cfg, meta, task),
        "num_augmentations": cfg.augmentation_slots(),
        "seed": cfg.shuffle_seed,
    }
    warn_if_not_intended(cfg, meta)
    return _read_split(cfg, meta, "train").map_batches(
        _expand_augment, batch_format="pyarrow", batch_size=MAP_BATCH_PUZZLES, fn_kwargs=kwargs
    )


class _ToTorch(NumpyBatchCollateFn):
    """Numpy batch -> the batch contract's tensor dtypes."""

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        # imported here: Ray workers that run the map stages load this module and need no torch
        import torch

        return {
            name: torch.from_numpy(np.array(batch[name], dtype=dtype))
            for name, dtype in BATCH_DTYPES.items()
        }


def epoch_seed(seed: int, epoch: int) -> int:
    """Local shuffle seed of one epoch."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def iter_torch_batches(
    data: Any,
    batch_size: int,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    *,
    buffer_rows: int = 4096,
    device: str = "auto",
) -> Iterable[dict[str, torch.Tensor]]:
    """Torch batches from a Dataset or a Ray Train shard (`ray.train.get_dataset_shard(name)`).

    With `shuffle`, rows are reshuffled in a buffer of `buffer_rows` rows (at least one batch)
    seeded by (seed, epoch). `device="auto"` is the Ray Train worker's device, else CPU."""
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1")
    shuffling = shuffle and buffer_rows > 0
    return data.iter_torch_batches(
        batch_size=batch_size,
        collate_fn=_ToTorch(),
        drop_last=drop_last,
        device=device,
        prefetch_batches=1,  # one batch formed ahead of the step
        local_shuffle_buffer_size=max(buffer_rows, batch_size) if shuffling else None,
        local_shuffle_seed=epoch_seed(seed, epoch) if shuffling else None,
    )
