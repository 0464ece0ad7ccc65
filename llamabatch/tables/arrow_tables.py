"""Parquet (a file, or several shards read as one table) and Arrow IPC / Feather input, read
one record batch at a time so memory stays flat however many rows there are.

Parquet is read row group by row group: a row group that cannot be read (a damaged page, a
bad checksum) costs its own rows, each getting an `unreadable_rows` error record, and
the rows after it still run. The row count comes from the footers, so row numbers (the
default ids) stay the same across runs even when a row group is unreadable.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Iterator

from .arrow_import import pyarrow_modules
from .cells import MAX_CELL_BYTES, check_size
from .errors import INVALID_ROW, UNREADABLE, RowProblem, TableError
from .raw_row import RawRow

log = logging.getLogger("llamabatch.tables")

BATCH_ROWS = 1024  # rows converted to Python at a time


def _why(exc: BaseException) -> str:
    """An exception as one readable line (Arrow's messages span lines and carry raw bytes)."""
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _checked(cells: dict[str, Any], max_cell_bytes: int) -> dict[str, Any]:
    for name, value in cells.items():
        check_size(name, value, max_cell_bytes)
    return cells


def _batch_rows(batch: Any) -> list[dict[str, Any] | RowProblem]:
    """A record batch as Python rows; a row whose values cannot be converted (invalid UTF-8 in
    a string column) is a RowProblem naming the column, and the other rows are kept."""
    try:
        return batch.to_pylist()
    except Exception:  # find the rows (and columns) that fail, one at a time
        out: list[dict[str, Any] | RowProblem] = []
        for i in range(batch.num_rows):
            row: dict[str, Any] = {}
            problem = None
            for name, column in zip(batch.schema.names, batch.columns):
                try:
                    row[name] = column[i].as_py()
                except Exception as exc:
                    what = "not valid UTF-8" if isinstance(exc, UnicodeDecodeError) else f"unreadable ({exc})"
                    problem = RowProblem(INVALID_ROW, f"column {name!r} is {what}")
                    break
            out.append(problem if problem is not None else row)
        return out


class ParquetTable:
    """One Parquet file or several (shards of one dataset, in the order given) as one table."""

    def __init__(self, files: list[str], name: str, max_cell_bytes: int = MAX_CELL_BYTES):
        _pa, pq, _ipc = pyarrow_modules(f"reading Parquet ({name})")
        if not files:
            raise TableError(f"{name} holds no .parquet files")
        self.name = name
        self.max_cell_bytes = max_cell_bytes
        self._pq = pq
        self._files = list(files)
        self._meta: list[tuple[str, list[int], list[str]]] = []  # (path, rows per row group, columns)
        columns: list[str] = []
        for path in self._files:
            try:
                f = pq.ParquetFile(path)
            except Exception as exc:
                raise TableError(f"cannot read the Parquet file {path}: {_why(exc)}") from None
            meta = f.metadata
            names = list(f.schema_arrow.names)
            self._meta.append((path, [meta.row_group(i).num_rows for i in range(meta.num_row_groups)], names))
            columns += [c for c in names if c not in columns]
            f.close()
        self.columns = columns

    def count(self) -> int | None:
        return sum(sum(groups) for _path, groups, _names in self._meta)

    def rows(self, columns: list[str] | None = None) -> Iterator[RawRow]:
        row = 0
        for path, groups, names in self._meta:
            wanted = names if columns is None else [c for c in names if c in columns]
            try:
                # buffer_size: stream each column chunk in 64 KiB reads instead of loading it whole,
                # so memory follows the batch, not the row group (a writer's default is 1Mi rows)
                f = self._pq.ParquetFile(path, buffer_size=1 << 16, pre_buffer=False)
            except Exception as exc:  # it was readable when the run started
                problem = f"cannot read the Parquet file {path}: {_why(exc)}"
                for _ in range(sum(groups)):
                    row += 1
                    yield RawRow(row, None, RowProblem(UNREADABLE, problem))
                continue
            try:
                for index, size in enumerate(groups):
                    done = 0
                    try:
                        for batch in f.iter_batches(batch_size=BATCH_ROWS, row_groups=[index], columns=wanted,
                                                    use_threads=False):
                            for cells in _batch_rows(batch):
                                row += 1
                                done += 1
                                yield self._raw(row, cells)
                    except Exception as exc:
                        log.debug("row group %d of %s", index, path, exc_info=True)
                        problem = (f"row group {index} of {path} could not be read: {_why(exc)}")
                        for _ in range(size - done):
                            row += 1
                            yield RawRow(row, None, RowProblem(UNREADABLE, problem))
            finally:
                f.close()

    def _raw(self, row: int, cells: dict[str, Any] | RowProblem) -> RawRow:
        if isinstance(cells, RowProblem):
            return RawRow(row, None, cells)
        try:
            return RawRow(row, _checked(cells, self.max_cell_bytes))
        except RowProblem as problem:
            return RawRow(row, None, problem)

    def close(self) -> None:
        pass


class ArrowTable:
    """An Arrow IPC file (.arrow, .feather v2) or stream, memory-mapped and read batch by batch."""

    def __init__(self, path: str, max_cell_bytes: int = MAX_CELL_BYTES):
        pa, _pq, ipc = pyarrow_modules(f"reading Arrow/Feather ({path})")
        self.name = path
        self.max_cell_bytes = max_cell_bytes
        try:
            self._source = pa.memory_map(path, "r")
        except Exception as exc:
            raise TableError(f"cannot read INPUT {path}: {_why(exc)}") from None
        try:
            self._reader = ipc.open_file(self._source)
            self._random = True
        except Exception:
            try:
                self._source.seek(0)
                self._reader = ipc.open_stream(self._source)
                self._random = False
            except Exception as exc:
                self._source.close()
                raise TableError(f"{path} is not an Arrow IPC file or stream (Feather v1 is not supported): "
                                 f"{_why(exc)}") from None
        self.columns = list(self._reader.schema.names)

    def count(self) -> int | None:
        if not self._random:
            return None
        try:
            return sum(self._reader.get_batch(i).num_rows for i in range(self._reader.num_record_batches))
        except Exception:
            return None

    def _batches(self) -> Iterator[Any]:
        if self._random:
            for i in range(self._reader.num_record_batches):
                yield self._reader.get_batch(i)
        else:
            yield from self._reader

    def rows(self, columns: list[str] | None = None) -> Iterator[RawRow]:
        row = 0
        try:
            for batch in self._batches():
                if columns is not None:
                    batch = batch.select([c for c in batch.schema.names if c in columns])
                for start in range(0, batch.num_rows, BATCH_ROWS):
                    for cells in _batch_rows(batch.slice(start, BATCH_ROWS)):
                        row += 1
                        if isinstance(cells, RowProblem):
                            yield RawRow(row, None, cells)
                            continue
                        try:
                            yield RawRow(row, _checked(cells, self.max_cell_bytes))
                        except RowProblem as problem:
                            yield RawRow(row, None, problem)
        except TableError:
            raise
        except Exception as exc:  # an IPC batch has no row count of its own to fail row by row
            raise TableError(f"cannot read {self.name} after row {row}: {_why(exc)}") from None

    def close(self) -> None:
        self._source.close()


def parquet_files_under(directory: str) -> list[str]:
    """A directory of Parquet shards: every *.parquet below it, in path order (part-00000, ...)."""
    found = []
    for root, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))  # _SUCCESS, .crc folders
        found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".parquet") and not f.startswith(".")]
    return found
