"""A split's stored puzzles as they are, read by the process that evaluates them (no Ray).

    rows = read_originals(cfg, meta, max_rows)   # numpy columns in stored order, aug index 0
    for batch in batches(rows, 64):              # tensors of the batch contract (``stream``)
        ...

Evaluation takes the originals of ``data.eval_split`` in stored order, unaugmented and unshuffled.
The stored columns are narrow integers (a 400,000-puzzle Sudoku split is about 70 MB), so each
evaluating process reads them with pyarrow, from a local folder or S3 alike, and keeps them:
a Ray Data pipeline per evaluation and per rank would start a streaming executor in every rank
and a map task in a Ray worker process each time, seconds of CPU for what a read of the files
does in milliseconds. A rank of several scores every world-th batch of the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from urm_ray.data.config import DataConfig
from urm_ray.data.store import BATCH_DTYPES, DatasetMeta, arrow_to_numpy, split_files
from urm_ray.data.tasks import registry
from urm_ray.errors import DataError


def read_originals(cfg: DataConfig, meta: DatasetMeta, max_rows: int = 0) -> dict[str, np.ndarray]:
    """The first ``max_rows`` rows (0: all) of ``cfg.eval_split`` in stored order as aug index 0;
    for a task with versions (ARC) their identifiers are those of version 0. DataError naming the
    available splits when the split is missing, or the file that cannot be read."""
    fs, files = split_files(cfg.path, meta, cfg.eval_split)
    tables, rows = [], 0
    for file in files:
        if max_rows and rows >= max_rows:
            break
        try:
            table = pq.read_table(file, filesystem=fs)
        except (OSError, pa.ArrowException) as err:  # removed, truncated or unreadable since written
            raise DataError(f"{cfg.path}: split {cfg.eval_split!r}, file {file}: cannot be read ({err})") from err
        tables.append(table)
        rows += len(table)
    table = pa.concat_tables(tables)  # a split has at least one file (``store.read_metadata``)
    return _as_originals(table.slice(0, max_rows) if max_rows else table, meta, cfg)


def _as_originals(table: pa.Table, meta: DatasetMeta, cfg: DataConfig) -> dict[str, np.ndarray]:
    """Stored rows as aug index 0, with version 0's identifiers for a task with versions."""
    cols = arrow_to_numpy(table)
    cols["aug_index"] = np.zeros(len(table), np.int32)
    versions = registry.of(meta).versions
    if versions is not None:
        cols["puzzle_identifiers"] = versions.identifiers(cols["puzzle_identifiers"], cols["aug_index"],
                                                          cfg.augmentation_slots())
    return cols


def _to_torch(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Numpy columns -> the batch contract's tensors (``BATCH_DTYPES``)."""
    return {name: torch.from_numpy(np.array(batch[name], dtype=dtype))  # a copy: arrow's are read-only
            for name, dtype in BATCH_DTYPES.items()}


def batches(rows: dict[str, np.ndarray], size: int, rank: int = 0, world: int = 1
            ) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of ``size`` rows in stored order (the last one partial), every ``world``-th from
    batch ``rank`` on: one rank's share of an evaluation."""
    total = len(rows["inputs"])
    for start in range(rank * size, total, world * size):
        yield _to_torch({name: column[start : start + size] for name, column in rows.items()})
