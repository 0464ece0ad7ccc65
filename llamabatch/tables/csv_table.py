"""CSV and TSV input (stdlib csv): a header row names the columns, each further record is a row.

Read lazily as text with errors="surrogateescape", so an undecodable byte spoils only the
cell it is in (cells.check_utf8 turns it into that row's error). A record with more or fewer
fields than the header (a ragged row) is that row's error. Blank lines are no rows.
"""
from __future__ import annotations

import csv
import sys
from typing import Iterator

from .cells import MAX_CELL_BYTES, check_size, check_utf8
from .errors import INVALID_ROW, RowProblem, TableError
from .raw_row import RawRow

# Cells are measured after parsing (cells.check_size): the csv module's own limit would raise
# mid-record, and recovering from inside a quoted field is guesswork.
csv.field_size_limit(sys.maxsize)


def delimiter_for(path: str, given: str | None) -> str:
    if given is not None:
        given = {"\\t": "\t", "tab": "\t"}.get(given, given)
        if len(given) != 1:
            raise TableError(f"--delimiter must be one character (or \\t), got {given!r}")
        return given
    return "\t" if path.lower().endswith((".tsv", ".tab")) else ","


class CsvTable:
    def __init__(self, path: str, delimiter: str | None = None, max_cell_bytes: int = MAX_CELL_BYTES):
        self.name = path
        self.delimiter = delimiter_for(path, delimiter)
        self.max_cell_bytes = max_cell_bytes
        self._file = self._open()
        self._reader = csv.reader(self._file, delimiter=self.delimiter)
        try:
            header = next((r for r in self._reader if r), None)
        except csv.Error as exc:
            self.close()
            raise TableError(f"cannot read the header row of {path}: {exc}") from None
        if header is None:
            self.close()
            raise TableError(f"{path} is empty: a CSV/TSV input needs a header row naming its columns")
        for i, name in enumerate(header):
            try:
                check_utf8("header", name)
            except RowProblem:
                self.close()
                raise TableError(f"the header row of {path} is not valid UTF-8 (column {i + 1})") from None
        duplicates = sorted({h for h in header if header.count(h) > 1})
        if duplicates:
            self.close()
            raise TableError(f"the header row of {path} names a column twice: {', '.join(map(repr, duplicates))}")
        if any(not h for h in header):
            self.close()
            raise TableError(f"the header row of {path} has an empty column name (column "
                             f"{header.index('') + 1}); every column needs a name")
        self.columns = header

    def _open(self):
        try:
            # utf-8-sig: a BOM that spreadsheet exports write is no part of the first column's name
            return open(self.name, encoding="utf-8-sig", errors="surrogateescape", newline="")
        except OSError as exc:
            raise TableError(f"cannot read INPUT {self.name}: {exc.strerror or exc}") from None

    def rows(self, columns: list[str] | None = None) -> Iterator[RawRow]:
        width = len(self.columns)
        row = 0
        while True:
            try:
                fields = next(self._reader)
            except StopIteration:
                return
            except csv.Error as exc:  # a malformed record: its row's error, then on with the next
                row += 1
                yield RawRow(row, None, RowProblem(INVALID_ROW, f"row {row} (line {self._reader.line_num}) "
                                                               f"is not valid CSV: {exc}"))
                continue
            if not fields:
                continue  # a blank line
            row += 1
            if len(fields) != width:
                yield RawRow(row, None, RowProblem(
                    INVALID_ROW, f"row {row} (line {self._reader.line_num}) has {len(fields)} field(s); "
                                 f"the header has {width}"))
                continue
            try:
                for name, value in zip(self.columns, fields):
                    check_size(name, value, self.max_cell_bytes)
                    check_utf8(name, value)
            except RowProblem as problem:
                yield RawRow(row, None, problem)
                continue
            yield RawRow(row, dict(zip(self.columns, fields)))

    def count(self) -> int | None:
        """The data rows (a second pass over the file, as rows() counts them)."""
        n = 0
        try:
            with self._open() as f:
                reader = csv.reader(f, delimiter=self.delimiter)
                header_seen = False
                while True:
                    try:
                        fields = next(reader)
                    except StopIteration:
                        break
                    except csv.Error:
                        n += 1
                        continue
                    if not fields:
                        continue
                    if header_seen:
                        n += 1
                    header_seen = True
        except (OSError, TableError):
            return None
        return n

    def close(self) -> None:
        self._file.close()
