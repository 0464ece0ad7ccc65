"""CSV and TSV input (stdlib csv): a header row names the columns, each further record is a row.

Read lazily as text with errors="surrogateescape", so an undecodable byte spoils only the
cell it is in (cells.check_utf8 turns it into that row's error). A record with more or fewer
fields than the header (a ragged row) is that row's error. Blank lines are no rows.

A quoted cell may span lines, so a stray quote that opens a cell and never closes it properly
would swallow the lines after it into one record: rows merged without a word (the csv module
is lenient). A record spanning lines must therefore be strictly valid CSV (its closing quote
followed by a delimiter or the line's end, and present before the file ends); one that is not
is its first line's error, and the lines after that are read again as rows of their own. A
stray quote that happens to close cleanly on a later line cannot be told from a quoted cell.
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
        self._records = _records(_Lines(self._file), self.delimiter)
        header = None
        for first, _last, fields, problem in self._records:
            if problem is not None:
                self.close()
                raise TableError(f"cannot read the header row of {path}: line {first} {problem}")
            if fields:
                header = fields
                break
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
        for first, last, fields, problem in self._records:
            if problem is not None:  # a malformed record: its row's error, then on with the next
                row += 1
                yield RawRow(row, None, RowProblem(INVALID_ROW, f"row {row} (line {first}) {problem}"))
                continue
            if not fields:
                continue  # a blank line
            row += 1
            if len(fields) != width:
                yield RawRow(row, None, RowProblem(
                    INVALID_ROW, f"row {row} (line {last}) has {len(fields)} field(s); the header has {width}"))
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
        header_seen = False
        try:
            with self._open() as f:
                for _first, _last, fields, problem in _records(_Lines(f), self.delimiter):
                    if problem is None and not fields:
                        continue
                    n += header_seen
                    header_seen = True
        except (OSError, TableError):
            return None
        return n

    def close(self) -> None:
        self._file.close()


class _Lines:
    """The file's lines for csv.reader, one at a time and numbered. `taken` holds the lines of
    the record being read, so that a record that is not valid CSV can give back all but its
    first line to be read again."""

    def __init__(self, file):
        self._file = file
        self._back: list[str] = []  # lines given back, the next one last
        self.taken: list[str] = []
        self.number = 0  # the physical line number of the last line handed out

    def __iter__(self) -> "_Lines":
        return self

    def __next__(self) -> str:
        line = self._back.pop() if self._back else next(self._file)
        self.number += 1
        self.taken.append(line)
        return line

    def give_back(self, lines: list[str]) -> None:
        self._back.extend(reversed(lines))
        self.number -= len(lines)


def _records(lines: _Lines, delimiter: str) -> Iterator[tuple[int, int, list[str] | None, str | None]]:
    """(first line, last line, fields, None) for each record ([] for a blank line), or
    (first line, last line, None, why) for one that is not valid CSV."""
    reader = csv.reader(lines, delimiter=delimiter)  # reads no further than the record it returns
    while True:
        lines.taken = []
        first = lines.number + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield first, lines.number, None, f"is not valid CSV: {exc}"
            continue
        if len(lines.taken) > 1:
            why = _unclosed_quote(lines.taken, delimiter)
            if why is not None:
                lines.give_back(lines.taken[1:])
                yield first, first, None, why
                continue
        yield first, lines.number, fields, None


def _unclosed_quote(taken: list[str], delimiter: str) -> str | None:
    """Why a record spanning `taken` lines is no quoted cell over several lines but a stray
    quote (None: it is strictly valid CSV)."""
    try:
        for _ in csv.reader(taken, delimiter=delimiter, strict=True):
            pass
    except csv.Error as exc:
        return (f"is not valid CSV: a quote opened on this line is not closed properly ({exc}); the "
                f"{len(taken) - 1} line(s) it ran over are read as rows of their own")
    return None
