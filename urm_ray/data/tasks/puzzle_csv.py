"""Puzzle CSVs in the Sudoku-Extreme / official maze layout: `source,question,answer,rating`, one
puzzle per row, each grid a string of one character per cell. Errors name the file and row.

Row R (1-based, header excluded) is line R + 1 of the file: empty lines count as (bad) rows.
"""

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


def read_csv_table(path: Path) -> pa.Table:
    """The CSV as string columns; DataError naming the file and row of a malformed row."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    bad_rows: list[Any] = []

    def on_invalid(row: Any) -> str:
        bad_rows.append(row)
        return "error"

    parse = pa_csv.ParseOptions(invalid_row_handler=on_invalid, ignore_empty_lines=False)
    convert = pa_csv.ConvertOptions(column_types={c: pa.string() for c in CSV_COLUMNS})
    read = pa_csv.ReadOptions(use_threads=False)  # row numbers of bad rows need one thread
    try:
        table = pa_csv.read_csv(
            path, read_options=read, parse_options=parse, convert_options=convert
        )
    except pa.ArrowInvalid as err:
        if not bad_rows:
            raise DataError(f"{path}: cannot parse CSV ({err})") from err
        row = bad_rows[0]  # `number` is the 1-based line
        raise DataError(
            f"{where(path, row.number - 1)}: malformed row with {row.actual_columns} columns,"
            f" expected {row.expected_columns} ({','.join(CSV_COLUMNS)}): {row.text[:100]!r}"
        ) from err
    missing = [c for c in CSV_COLUMNS if c not in table.column_names]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {missing}; header is {table.column_names},"
            f" expected {list(CSV_COLUMNS)}"
        )
    return table


def char_matrix(table: pa.Table, column: str, length: int, path: Path) -> np.ndarray:
    """[N, length] uint8 bytes of a string column; DataError for the first row of another length."""
    arr = table.column(column).combine_chunks()
    lengths = pc.binary_length(arr).fill_null(-1).to_numpy(zero_copy_only=False)  # [N]
    bad = np.flatnonzero(lengths != length)
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"{where(path, i + 1)}: {column} has {max(lengths[i], 0)} characters,"
            f" expected {length}"
        )
    fixed = arr.cast(pa.binary(length))
    data = np.frombuffer(fixed.buffers()[1], dtype=np.uint8)
    start = fixed.offset * length
    return data[start : start + len(fixed) * length].reshape(len(fixed), length)
