"""Which reader a path needs: by its extension, a directory of Parquet shards, or an hf: spec."""
from __future__ import annotations

import os

from .arrow_tables import ArrowTable, ParquetTable, parquet_files_under
from .cells import MAX_CELL_BYTES
from .csv_table import CsvTable
from .errors import TableError
from .hf_cache import is_hf_spec, resolve
from .raw_row import Table

CSV_EXTENSIONS = (".csv", ".tsv", ".tab")
PARQUET_EXTENSIONS = (".parquet", ".pq")
ARROW_EXTENSIONS = (".arrow", ".feather", ".ipc")
TABLE_EXTENSIONS = CSV_EXTENSIONS + PARQUET_EXTENSIONS + ARROW_EXTENSIONS


def is_table_input(path: str) -> bool:
    """Whether `run` reads `path` as a table (rather than JSONL or text lines)."""
    return is_hf_spec(path) or path.lower().endswith(TABLE_EXTENSIONS) or (path != "-" and os.path.isdir(path))


def open_table(path: str, *, delimiter: str | None = None, max_cell_bytes: int = MAX_CELL_BYTES,
               environ: dict | None = None) -> Table:
    """The reader for `path`. Raises TableError (MissingExtra without pyarrow) in one line."""
    if is_hf_spec(path):
        files, name = resolve(path, environ)
        return ParquetTable(files, name, max_cell_bytes)
    if path == "-":
        raise TableError("a table INPUT is a file (stdin is read as prompt lines: drop --delimiter and the "
                         "table flags, or save the table to a file)")
    if os.path.isdir(path):
        files = parquet_files_under(path)
        if not files:
            raise TableError(f"INPUT {path} is a directory with no .parquet files in it")
        return ParquetTable(files, path, max_cell_bytes)
    if not os.path.exists(path):
        raise TableError(f"cannot read INPUT {path}: No such file or directory")
    lower = path.lower()
    if delimiter is not None or lower.endswith(CSV_EXTENSIONS):
        return CsvTable(path, delimiter, max_cell_bytes)
    if lower.endswith(PARQUET_EXTENSIONS):
        return ParquetTable([path], path, max_cell_bytes)
    if lower.endswith(ARROW_EXTENSIONS):
        return ArrowTable(path, max_cell_bytes)
    raise TableError(f"INPUT {path} is not a table: name it .csv, .tsv, .parquet, .arrow or .feather, "
                     "or give --delimiter for delimited text")
