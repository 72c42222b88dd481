"""On-disk dataset layout: Parquet files per split plus `metadata.json`, written atomically.

A dataset folder looks like

    <out_dir>/metadata.json
    <out_dir>/<split>/part-00000.parquet   (more parts for large splits)

Each Parquet file has the columns
    inputs              fixed_size_list<intK>[seq_len]   token ids
    labels              fixed_size_list<intK>[seq_len]   token ids, -100 (`ignore_label`) = no loss
    puzzle_identifiers  int32                            index into the puzzle-embedding table
    puzzle_index        int64                            stable id of the original puzzle
with intK the narrowest of int8/int16/int32 that holds the vocabulary and -100. Only originals are
stored; augmentation happens when streaming. A fixed-size list keeps each row's tokens contiguous,
so `arrow_to_numpy` turns a column into an [N, seq_len] array without a per-row loop.

A dataset is read from a local folder or from a URL (``s3://bucket/prefix``, through pyarrow's
filesystems; a custom S3 endpoint such as MinIO comes from $AWS_ENDPOINT_URL); it is written to a
local folder (`urm-ray data`), and uploaded as it is for a multi-node cluster.
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq

from urm_ray import __version__
from urm_ray.errors import DataError

FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
COLUMNS = ("inputs", "labels", "puzzle_identifiers", "puzzle_index")
SEQUENCE_COLUMNS = ("inputs", "labels")
# the batch contract: the dtype of each column of a batch handed to the model
BATCH_DTYPES = {"inputs": np.int32, "labels": np.int64, "puzzle_identifiers": np.int32,
                "puzzle_index": np.int64, "aug_index": np.int32}
DEFAULT_ROWS_PER_FILE = 32_768  # several files let Ray Data read and augment in parallel


@dataclass
class SplitInfo:
    """One split of a dataset."""

    # number of rows (original puzzles) in the split
    num_rows: int
    # Parquet files of the split, relative to the dataset folder, in row order
    files: list[str]


@dataclass
class DatasetMeta:
    """Contents of `metadata.json`: the task shape plus how the dataset was built."""

    # task name, e.g. "sudoku"
    task: str
    # number of token ids; inputs and labels lie in [0, vocab_size)
    vocab_size: int
    # tokens per row
    seq_len: int
    # rows of the puzzle-embedding table; puzzle_identifiers lie in [0, num_puzzle_identifiers)
    num_puzzle_identifiers: int
    # the task's on-the-fly augmentation (`PuzzleTask.augmentation` in `tasks.registry`), or "none"
    augmentation: str
    # token id of padding
    pad_id: int = 0
    # label value that the loss ignores
    ignore_label: int = -100
    # split name -> rows and files; filled by `write_dataset`
    splits: dict[str, SplitInfo] = field(default_factory=dict)
    # how the dataset was built: arguments, seed, source files, urm_ray version, time
    build: dict[str, Any] = field(default_factory=dict)
    # layout version of the folder
    format_version: int = FORMAT_VERSION


_INT_KEYS = (
    "format_version",
    "vocab_size",
    "seq_len",
    "num_puzzle_identifiers",
    "pad_id",
    "ignore_label",
)
_STR_KEYS = ("task", "augmentation")


def is_url(path: str | os.PathLike) -> bool:
    """Whether a dataset location is a URL (``s3://...``) rather than a local folder."""
    return "://" in str(path)


def join(path: str | os.PathLike, rel: str) -> str:
    """``rel`` under a dataset folder or URL (a URL keeps its ``//``, which Path would fold)."""
    return f"{str(path).rstrip('/')}/{rel}" if is_url(path) else str(Path(path) / rel)


def filesystem(path: str | os.PathLike) -> tuple[pyarrow.fs.FileSystem, str]:
    """The pyarrow filesystem of a local folder or URL, and the path within it."""
    if not is_url(path):
        return pyarrow.fs.LocalFileSystem(), str(Path(path).resolve())
    try:
        return pyarrow.fs.FileSystem.from_uri(str(path))
    except (OSError, pa.ArrowException) as err:
        raise DataError(f"{path}: not a dataset location pyarrow can open ({err}); expected a "
                        "local folder or s3://bucket/prefix") from err


def _is_file(fs: pyarrow.fs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type == pyarrow.fs.FileType.File


def read_metadata(path: str | os.PathLike) -> DatasetMeta:
    """Reads and validates `<path>/metadata.json` (a local folder or a URL); raises DataError
    naming the file and key."""
    meta_file = join(path, METADATA_FILE)
    fs, root = filesystem(path)
    try:
        if not _is_file(fs, f"{root}/{METADATA_FILE}"):
            raise DataError(f"{meta_file}: not found; is {path} a dataset folder written by urm_ray?")
        with fs.open_input_stream(f"{root}/{METADATA_FILE}") as stream:
            text = stream.read().decode()
    except (OSError, pa.ArrowException) as err:  # a bucket that is missing or refuses access
        raise DataError(f"{meta_file}: cannot be read ({err})") from err
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{meta_file}: invalid JSON ({err})") from err
    if not isinstance(raw, dict):
        raise DataError(f"{meta_file}: expected a JSON object, got {type(raw).__name__}")
    meta = _meta_from_dict(raw, meta_file)
    _check_split_files(meta, fs, root, meta_file)
    return meta


def metadata_digest(source: DatasetMeta | str | os.PathLike) -> str:
    """A short fingerprint of a dataset, without reading its Parquet files: the hash of its
    `metadata.json` as this module writes it (`source`: the metadata already read, or the folder
    or URL to read it from). The metadata lists every file with its row count and records the
    build (arguments, seed, time), so a rebuilt or changed dataset gets a new digest."""
    meta = source if isinstance(source, DatasetMeta) else read_metadata(source)
    return hashlib.sha256(metadata_text(meta).encode()).hexdigest()[:8]


def metadata_text(meta: DatasetMeta) -> str:
    """The `metadata.json` of `meta`, as `write_dataset` writes it."""
    return json.dumps(dataclasses.asdict(meta), indent=2) + "\n"


def _meta_from_dict(raw: dict[str, Any], meta_file: str) -> DatasetMeta:
    for key in (*_INT_KEYS, *_STR_KEYS, "splits", "build"):
        if key not in raw:
            raise DataError(f"{meta_file}: missing key {key!r}")
    if raw["format_version"] != FORMAT_VERSION:
        raise DataError(
            f"{meta_file}: format_version={raw['format_version']!r}; this urm_ray reads"
            f" {FORMAT_VERSION}"
        )
    for key in _INT_KEYS:
        if not isinstance(raw[key], int) or isinstance(raw[key], bool):
            raise DataError(f"{meta_file}: key {key!r} must be an int, got {raw[key]!r}")
    for key in _STR_KEYS:
        if not isinstance(raw[key], str) or not raw[key]:
            raise DataError(
                f"{meta_file}: key {key!r} must be a non-empty string, got {raw[key]!r}"
            )
    for key in ("vocab_size", "seq_len", "num_puzzle_identifiers"):
        if raw[key] < 1:
            raise DataError(f"{meta_file}: key {key!r} must be >= 1, got {raw[key]}")
    if not isinstance(raw["build"], dict):
        raise DataError(f"{meta_file}: key 'build' must be an object, got {raw['build']!r}")
    fields = {f.name for f in dataclasses.fields(DatasetMeta)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise DataError(f"{meta_file}: unknown key(s) {unknown}; expected {sorted(fields)}")
    return DatasetMeta(**{**raw, "splits": _splits_from_dict(raw["splits"], meta_file)})


def _splits_from_dict(raw: Any, meta_file: str) -> dict[str, SplitInfo]:
    if not isinstance(raw, dict) or not raw:
        raise DataError(f"{meta_file}: key 'splits' must be a non-empty object, got {raw!r}")
    splits = {}
    for name, info in raw.items():
        key = f"splits.{name}"
        if not isinstance(info, dict) or set(info) != {"num_rows", "files"}:
            raise DataError(
                f"{meta_file}: key {key!r} must have exactly 'num_rows' and 'files', got {info!r}"
            )
        if not isinstance(info["num_rows"], int) or info["num_rows"] < 0:
            raise DataError(
                f"{meta_file}: key '{key}.num_rows' must be an int >= 0, got {info['num_rows']!r}"
            )
        files = info["files"]
        if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
            raise DataError(
                f"{meta_file}: key '{key}.files' must be a non-empty list of paths, got {files!r}"
            )
        splits[name] = SplitInfo(num_rows=info["num_rows"], files=files)
    return splits


def _check_split_files(meta: DatasetMeta, fs: pyarrow.fs.FileSystem, root: str, meta_file: str) -> None:
    """Every split file exists, has a readable Parquet footer, and agrees with the metadata:
    row counts, the token columns' length (seq_len) and, from the footer's statistics, the
    token range (vocab_size, ignore_label). Footers only: no data page is read."""
    shown_root = meta_file[: -len(METADATA_FILE) - 1]
    for name, info in meta.splits.items():
        rows = 0
        for rel in info.files:
            path = f"{root}/{rel}"
            try:
                found = _is_file(fs, path)
            except (OSError, pa.ArrowException) as err:
                raise DataError(f"{meta_file}: file {rel!r} of split {name!r} cannot be read ({err})") from err
            if not found:
                raise DataError(
                    f"{meta_file}: file {rel!r} of split {name!r} does not exist under {shown_root}"
                )
            rows += _check_parquet_file(meta, fs, path, join(shown_root, rel))
        if rows != info.num_rows:
            raise DataError(f"{meta_file}: split {name!r} has num_rows={info.num_rows}, but its "
                            f"files hold {rows} rows")


def _check_parquet_file(meta: DatasetMeta, fs: pyarrow.fs.FileSystem, path: str, shown: str) -> int:
    """Rows of one split file (``shown`` in errors), after checking its footer against the
    metadata."""
    try:
        parquet = pq.ParquetFile(fs.open_input_file(path))
    except (OSError, pa.ArrowException) as err:
        raise DataError(f"{shown}: not a readable Parquet file ({err})") from err
    schema = parquet.schema_arrow
    for column, low in (("inputs", 0), ("labels", min(0, meta.ignore_label))):
        if column not in schema.names or not pa.types.is_fixed_size_list(schema.field(column).type):
            raise DataError(f"{shown}: expected a fixed_size_list column {column!r}; columns: {schema.names}")
        length = schema.field(column).type.list_size
        if length != meta.seq_len:
            raise DataError(f"{shown}: column {column!r} holds {length} tokens per row, but metadata.json "
                            f"says seq_len={meta.seq_len}")
        lowest, highest = _column_range(parquet, column)
        if lowest is not None and (lowest < low or highest >= meta.vocab_size):
            raise DataError(f"{shown}: column {column!r} holds token ids in [{lowest}, {highest}], outside "
                            f"metadata.json's vocab_size={meta.vocab_size} (ignore_label {meta.ignore_label})")
    return parquet.metadata.num_rows


def _column_range(parquet: pq.ParquetFile, column: str) -> tuple[int | None, int | None]:
    """(min, max) of a list column's values from the row groups' statistics; (None, None) if absent."""
    lows, highs = [], []
    leaf = next((i for i in range(parquet.metadata.num_columns)
                 if parquet.metadata.schema.column(i).path.split(".")[0] == column), None)
    for group in range(parquet.metadata.num_row_groups):
        stats = parquet.metadata.row_group(group).column(leaf).statistics
        if stats is None or not stats.has_min_max:
            return None, None
        lows.append(stats.min)
        highs.append(stats.max)
    return (min(lows), max(highs)) if lows else (None, None)


def split_paths(path: str | os.PathLike, meta: DatasetMeta, split: str) -> list[str]:
    """Absolute Parquet paths (or URLs) of `split`; DataError naming the available splits if it
    is missing."""
    if split not in meta.splits:
        raise DataError(
            f"{join(path, METADATA_FILE)}: no split {split!r}; available: {sorted(meta.splits)}"
        )
    if is_url(path):
        return [join(path, rel) for rel in meta.splits[split].files]
    return [str((Path(path) / rel).resolve()) for rel in meta.splits[split].files]


def split_files(path: str | os.PathLike, meta: DatasetMeta, split: str) -> tuple[pyarrow.fs.FileSystem, list[str]]:
    """The filesystem of a dataset and the paths of `split`'s Parquet files within it."""
    fs, root = filesystem(path)
    split_paths(path, meta, split)  # names the available splits if it is missing
    return fs, [f"{root}/{rel}" for rel in meta.splits[split].files]


def token_dtype(vocab_size: int, ignore_label: int) -> np.dtype:
    """Narrowest signed integer type holding every token id and the ignore label."""
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if vocab_size - 1 <= info.max and ignore_label >= info.min:
            return np.dtype(dtype)
    raise DataError(f"vocab_size={vocab_size} does not fit in int32")


def write_dataset(
    out_dir: str | os.PathLike,
    splits: dict[str, dict[str, np.ndarray]],
    meta: DatasetMeta,
    *,
    overwrite: bool = False,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
    extra_files: dict[str, str] | None = None,
) -> DatasetMeta:
    """Validates `splits` against `meta` and writes the dataset folder atomically.

    `splits` maps a split name to the columns `COLUMNS` (inputs / labels [N, seq_len], ids [N]).
    `extra_files` maps a file name to text written next to `metadata.json` (task-specific tables,
    e.g. ARC's task list), inside the same atomic rename.
    Everything is written to a temporary folder next to `out_dir` and renamed at the end, so on
    error nothing is left behind. Returns `meta` with `splits` filled and the urm_ray version and
    time added to `build`.
    """
    return write_dataset_chunks(
        out_dir, {name: [cols] for name, cols in splits.items()}, meta,
        overwrite=overwrite, rows_per_file=rows_per_file, extra_files=extra_files,
    )


def write_dataset_chunks(
    out_dir: str | os.PathLike,
    splits: dict[str, Iterable[dict[str, np.ndarray]]],
    meta: DatasetMeta,
    *,
    overwrite: bool = False,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
    extra_files: dict[str, str] | None = None,
) -> DatasetMeta:
    """Like `write_dataset`, but each split is an iterable of column chunks, consumed one at a
    time (e.g. a generator), so memory stays bounded by a chunk and one Parquet part.

    Chunks are validated as they arrive; an error names the split and the row counted from the
    split's start, and leaves nothing behind (the temporary folder is removed)."""
    out = check_output_folder(out_dir, overwrite)
    if not splits:
        raise DataError(f"{out}: no splits to write")
    if rows_per_file < 1:
        raise DataError(f"rows_per_file={rows_per_file} must be >= 1")
    for name in splits:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise DataError(f"split name {name!r} must be letters, digits, '_' or '-'")
    extra_files = extra_files or {}
    for name in extra_files:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name == METADATA_FILE or name in splits:
            raise DataError(f"extra file name {name!r} must be a plain file name, not a split"
                            f" or {METADATA_FILE}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        infos = {
            name: _write_split(tmp, name, chunks, meta, rows_per_file)
            for name, chunks in splits.items()
        }
        build = {
            **meta.build,
            "urm_ray_version": __version__,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        meta = dataclasses.replace(meta, splits=infos, build=build, format_version=FORMAT_VERSION)
        for name, text in extra_files.items():
            (tmp / name).write_text(text)
        (tmp / METADATA_FILE).write_text(metadata_text(meta))
        _move_into_place(tmp, out, overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


def _write_split(
    tmp: Path,
    split: str,
    chunks: Iterable[dict[str, np.ndarray]],
    meta: DatasetMeta,
    rows_per_file: int,
) -> SplitInfo:
    """Writes the chunks of one split as parts of `rows_per_file` rows (at least one part)."""
    (tmp / split).mkdir()
    files: list[str] = []
    writer: pq.ParquetWriter | None = None
    in_file = num_rows = 0
    for chunk in chunks:
        cols = _validated_split(split, chunk, meta, offset=num_rows)
        start, length = 0, len(cols["inputs"])
        while start < length:
            if writer is None or in_file == rows_per_file:
                if writer is not None:
                    writer.close()
                files.append(f"{split}/part-{len(files):05d}.parquet")
                writer, in_file = None, 0
            take = min(rows_per_file - in_file, length - start)
            table = numpy_to_arrow({c: a[start : start + take] for c, a in cols.items()})
            if writer is None:
                writer = pq.ParquetWriter(tmp / files[-1], table.schema, compression="zstd")
            writer.write_table(table, row_group_size=65536)
            start, in_file, num_rows = start + take, in_file + take, num_rows + take
    if writer is not None:
        writer.close()
    if not files:  # an empty split still gets one (empty) file with the right schema
        files.append(f"{split}/part-00000.parquet")
        empty = _validated_split(split, _empty_columns(meta), meta)
        pq.write_table(numpy_to_arrow(empty), tmp / files[0], compression="zstd")
    return SplitInfo(num_rows=num_rows, files=files)


def _empty_columns(meta: DatasetMeta) -> dict[str, np.ndarray]:
    return {
        "inputs": np.zeros((0, meta.seq_len), np.int64),
        "labels": np.zeros((0, meta.seq_len), np.int64),
        "puzzle_identifiers": np.zeros(0, np.int64),
        "puzzle_index": np.zeros(0, np.int64),
    }


def split_chunk_stream(
    chunks: Iterator[tuple[np.ndarray, np.ndarray]], sizes: dict[str, int]
) -> dict[str, Iterator[dict[str, np.ndarray]]]:
    """Cuts one stream of generated (inputs, labels) chunks into consecutive splits of `sizes`
    rows, in dict order, as column chunks for `write_dataset_chunks` (which consumes the splits
    in that order). Every row gets puzzle identifier 0; `puzzle_index` counts from 0 per split.
    The stream must hold at least sum(sizes) rows."""
    leftover: list[tuple[np.ndarray, np.ndarray]] = []

    def take(count: int) -> Iterator[dict[str, np.ndarray]]:
        index = 0
        while index < count:
            inputs, labels = leftover.pop() if leftover else next(chunks)
            rest = count - index
            if len(inputs) > rest:
                leftover.append((inputs[rest:], labels[rest:]))
                inputs, labels = inputs[:rest], labels[:rest]
            yield {
                "inputs": inputs,  # [C, L]
                "labels": labels,  # [C, L]
                "puzzle_identifiers": np.zeros(len(inputs), np.int32),  # [C]
                "puzzle_index": np.arange(index, index + len(inputs), dtype=np.int64),  # [C]
            }
            index += len(inputs)

    return {name: take(count) for name, count in sizes.items()}


def _validated_split(
    split: str, cols: dict[str, Any], meta: DatasetMeta, offset: int = 0
) -> dict[str, np.ndarray]:
    """Columns checked and cast to the stored dtypes; errors count rows from `offset`."""
    missing = [c for c in COLUMNS if c not in cols]
    extra = sorted(set(cols) - set(COLUMNS))
    if missing or extra:
        raise DataError(
            f"split {split!r}: columns missing {missing}, unexpected {extra};"
            f" expected {list(COLUMNS)}"
        )
    out = {c: _sequence_matrix(split, c, cols[c], meta.seq_len, offset) for c in SEQUENCE_COLUMNS}
    out["puzzle_identifiers"] = _id_vector(split, "puzzle_identifiers", cols["puzzle_identifiers"])
    out["puzzle_index"] = _id_vector(split, "puzzle_index", cols["puzzle_index"])
    num_rows = len(out["inputs"])
    for name, arr in out.items():
        if arr.shape[0] != num_rows:
            raise DataError(
                f"split {split!r}: column {name!r} has {arr.shape[0]} rows, 'inputs' has {num_rows}"
            )
    _check_range(split, "inputs", out["inputs"], 0, meta.vocab_size, offset=offset)
    _check_range(
        split, "labels", out["labels"], 0, meta.vocab_size, meta.ignore_label, offset=offset
    )
    _check_range(
        split, "puzzle_identifiers", out["puzzle_identifiers"], 0, meta.num_puzzle_identifiers,
        offset=offset,
    )
    seq_dtype = token_dtype(meta.vocab_size, meta.ignore_label)
    return {
        "inputs": out["inputs"].astype(seq_dtype),  # [N, L]
        "labels": out["labels"].astype(seq_dtype),  # [N, L]
        "puzzle_identifiers": out["puzzle_identifiers"].astype(np.int32),  # [N]
        "puzzle_index": out["puzzle_index"].astype(np.int64),  # [N]
    }


def _sequence_matrix(
    split: str, column: str, rows: Any, seq_len: int, offset: int = 0
) -> np.ndarray:
    """[N, seq_len] integer matrix from an array or a list of rows; names the first bad row."""
    if isinstance(rows, np.ndarray) and rows.dtype != object and rows.ndim == 2:
        if rows.shape[1] != seq_len:
            raise DataError(
                f"split {split!r} row {offset}: {column} has length {rows.shape[1]},"
                f" expected seq_len={seq_len}"
            )
        matrix = rows
    else:
        for i, row in enumerate(rows):
            if np.ndim(row) != 1 or len(row) != seq_len:
                raise DataError(
                    f"split {split!r} row {offset + i}: {column} has shape {np.shape(row)},"
                    f" expected ({seq_len},)"
                )
        matrix = np.asarray(list(rows)).reshape(-1, seq_len)
    if not np.issubdtype(matrix.dtype, np.integer):
        raise DataError(f"split {split!r}: {column} must hold integers, got dtype {matrix.dtype}")
    return matrix


def _id_vector(split: str, column: str, values: Any) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise DataError(
            f"split {split!r}: {column} must be a 1-D integer array,"
            f" got shape {arr.shape} {arr.dtype}"
        )
    return arr


def _check_range(
    split: str,
    column: str,
    values: np.ndarray,
    lo: int,
    hi: int,
    allowed: int | None = None,
    offset: int = 0,
) -> None:
    """Every value in [lo, hi) or == allowed; DataError naming the first bad row."""
    bad = (values < lo) | (values >= hi)
    if allowed is not None:
        bad &= values != allowed
    if bad.any():
        row = int(np.argmax(bad.reshape(len(values), -1).any(axis=1)))
        extra = f" or {allowed}" if allowed is not None else ""
        value = np.atleast_1d(values[row])[np.atleast_1d(bad[row])][0]
        raise DataError(
            f"split {split!r} row {offset + row}: {column} has value {value} outside"
            f" [{lo}, {hi}){extra}"
        )


def check_output_folder(out_dir: str | os.PathLike, overwrite: bool) -> Path:
    """``out_dir`` resolved, when a dataset may be written there: it does not exist, or
    ``overwrite`` is set and it holds a dataset (its metadata.json) or nothing. Builders call it
    before any work; a folder that is not a dataset is never replaced."""
    out = Path(out_dir).resolve()
    if not out.exists():
        return out
    if not overwrite:
        raise DataError(f"{out}: already exists; pass --overwrite (overwrite=True in Python) to replace it")
    if out.is_dir() and ((out / METADATA_FILE).is_file() or not any(out.iterdir())):
        return out
    raise DataError(f"{out}: exists and is not a urm_ray dataset (no {METADATA_FILE}); not replacing it")


def _move_into_place(tmp: Path, out: Path, overwrite: bool) -> None:
    """Renames `tmp` to `out`. Without `overwrite` the rename fails if `out` appeared meanwhile (a
    concurrent build); with it, an existing `out` is swapped away first and removed after."""
    if not overwrite:
        try:
            tmp.rename(out)
        except OSError as err:
            raise DataError(f"{out}: already exists (written concurrently?); not replaced") from err
        return
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
    had_old = out.exists()
    if had_old:
        out.rename(old)
    tmp.rename(out)
    if had_old:
        shutil.rmtree(old)


def numpy_to_arrow(cols: dict[str, np.ndarray]) -> pa.Table:
    """Arrow table of the stored layout: [N, L] arrays become fixed_size_list<intK>[L] columns."""
    arrays = {}
    for name, arr in cols.items():
        if arr.ndim == 2:
            flat = pa.array(np.ascontiguousarray(arr).reshape(-1))
            arrays[name] = pa.FixedSizeListArray.from_arrays(flat, arr.shape[1])
        else:
            arrays[name] = pa.array(arr)
    return pa.table(arrays)


def arrow_to_numpy(table: pa.Table) -> dict[str, np.ndarray]:
    """Columns of a stored-layout table as numpy; fixed-size lists become [N, L] arrays."""
    out = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(col.type):
            width = col.type.list_size
            out[name] = col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), width)
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


def read_split(path: str | os.PathLike, split: str) -> dict[str, np.ndarray]:
    """All rows of one split as numpy arrays, read without Ray (for evaluation and tests)."""
    meta = read_metadata(path)
    tables = [pq.read_table(f) for f in split_paths(path, meta, split)]  # pyarrow opens URLs too
    return arrow_to_numpy(pa.concat_tables(tables))
