"""Puzzle CSVs in the Sudoku-Extreme / official maze layout: `source,question,answer,rating`, one
puzzle per row, each grid a string of one character per cell. Errors name the file and row.

Row R (1-based, header excluded) is line R + 1 of the file: empty lines count as (bad) rows.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from urm_ray.errors import DataError

CSV_COLUMNS = ("source", "question", "answer", "rating")


def where(path: Path, row: int) -> str:
    return f"{path}: row {row} (line {row + 1})"


def _options(on_invalid: Any, block_bytes: int | None = None) -> dict[str, Any]:
    read = pa_csv.ReadOptions(use_threads=False)  # row numbers of bad rows need one thread
    if block_bytes:
        read.block_size = block_bytes
    return {
        "read_options": read,
        "parse_options": pa_csv.ParseOptions(invalid_row_handler=on_invalid,
                                             ignore_empty_lines=False),
        "convert_options": pa_csv.ConvertOptions(
            column_types={c: pa.string() for c in CSV_COLUMNS}
        ),
    }


def _parse_error(path: Path, bad_rows: list[Any], err: Exception) -> DataError:
    if not bad_rows:
        return DataError(f"{path}: cannot parse CSV ({err})")
    row = bad_rows[0]  # `number` is the 1-based line
    return DataError(
        f"{where(path, row.number - 1)}: malformed row with {row.actual_columns} columns,"
        f" expected {row.expected_columns} ({','.join(CSV_COLUMNS)}): {row.text[:100]!r}"
    )


def _check_columns(path: Path, names: list[str]) -> None:
    missing = [c for c in CSV_COLUMNS if c not in names]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {missing}; header is {names}, expected {list(CSV_COLUMNS)}"
        )


def read_csv_table(path: Path) -> pa.Table:
    """The CSV as string columns; DataError naming the file and row of a malformed row."""
    return pa.concat_tables([table for _, table in iter_csv_tables(path, block_bytes=None)])


def iter_csv_tables(
    path: Path, block_bytes: int | None = 8 * 2**20
) -> Iterator[tuple[int, pa.Table]]:
    """Streams the CSV as (rows before this block, string-column table) blocks of about
    `block_bytes` of text (None: the whole file at once), so memory stays bounded by a block.
    DataError naming the file and row of a malformed row, or the missing columns."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    bad_rows: list[Any] = []

    def on_invalid(row: Any) -> str:
        bad_rows.append(row)
        return "error"

    options = _options(on_invalid, block_bytes)
    try:
        if block_bytes is None:
            table = pa_csv.read_csv(path, **options)
            _check_columns(path, table.column_names)
            yield 0, table
            return
        reader = pa_csv.open_csv(path, **options)
        _check_columns(path, reader.schema.names)
        offset = 0
        for batch in reader:
            yield offset, pa.Table.from_batches([batch])
            offset += batch.num_rows
    except pa.ArrowInvalid as err:
        raise _parse_error(path, bad_rows, err) from err


def char_matrix(
    table: pa.Table, column: str, length: int, path: Path, offset: int = 0
) -> np.ndarray:
    """[N, length] uint8 bytes of a string column; DataError for the first row of another length
    (rows counted after `offset` earlier rows)."""
    arr = table.column(column).combine_chunks()
    lengths = pc.binary_length(arr).fill_null(-1).to_numpy(zero_copy_only=False)  # [N]
    bad = np.flatnonzero(lengths != length)
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"{where(path, offset + i + 1)}: {column} has {max(lengths[i], 0)} characters,"
            f" expected {length}"
        )
    fixed = arr.cast(pa.binary(length))
    data = np.frombuffer(fixed.buffers()[1], dtype=np.uint8)
    start = fixed.offset * length
    return data[start : start + len(fixed) * length].reshape(len(fixed), length)
