"""`read_rows`: a table's rows as prompts with ids, for `run` and for library users.

    from llamabatch import Engine
    from llamabatch.tables import read_rows

    rows = list(read_rows("reviews.csv", template="Classify the sentiment: {review}"))
    for row, result in zip(rows, engine.generate([r.prompt for r in rows if r.ok])): ...

A row that cannot become a prompt is yielded with `error` set (and no prompt): never
skipped, never raised, so every row gets exactly one outcome. Problems with the whole table
(unreadable file, no header, a template field that names no column) raise TableError before
the first row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from .cells import MAX_CELL_BYTES, json_value
from .errors import INVALID_ROW, RowProblem, TableError
from .open_table import open_table
from .raw_row import RawRow, Table
from .template import PromptTemplate

RowId = Any  # str or int


@dataclass
class Row:
    row: int  # 1-based data row number
    id: RowId  # the --id-column cell, or the row number
    prompt: str | list[dict] | None  # text, or chat messages; None when `error` is set
    columns: dict[str, Any]  # the kept columns, as JSON values
    error: tuple[str, str] | None = None  # (code, message)

    @property
    def ok(self) -> bool:
        return self.error is None


def _is_id(value: Any) -> bool:
    return (isinstance(value, str) and bool(value)) or (isinstance(value, int) and not isinstance(value, bool))


class RowReader:
    """A table opened and checked against its template, its kept columns and its id column:
    `rows()` then yields Row objects. Everything that can fail for the whole table has failed
    (TableError) by the time the constructor returns."""

    def __init__(self, table: Table, template: PromptTemplate, *, id_column: str | None = None,
                 keep_columns: Sequence[str] | str | None = None):
        self.table = table
        self.template = template
        self.id_column = id_column
        columns = table.columns
        template.check(columns, table.name)
        if id_column is not None and id_column not in columns:
            raise TableError(f"--id-column {id_column!r} is not a column of {table.name}; its columns: "
                             f"{', '.join(columns)}")
        if keep_columns == "all":
            self.keep = list(columns)
        else:
            self.keep = list(keep_columns or [])
            unknown = [c for c in self.keep if c not in columns]
            if unknown:
                raise TableError(f"--keep-columns names {', '.join(map(repr, unknown))}, not "
                                 f"{'a column' if len(unknown) == 1 else 'columns'} of {table.name}; its columns: "
                                 f"{', '.join(columns)}")
        needed = list(dict.fromkeys(template.fields + self.keep + ([id_column] if id_column else [])))
        self._needed = needed

    def rows(self) -> Iterator[Row]:
        for raw in self.table.rows(self._needed):
            yield self._row(raw)

    def _row(self, raw: RawRow) -> Row:
        cells = raw.cells or {}
        kept = {c: json_value(cells.get(c)) for c in self.keep}
        row_id: RowId = raw.row
        try:
            if raw.problem is not None:
                raise raw.problem
            if self.id_column is not None:
                value = cells.get(self.id_column)
                if not _is_id(value):
                    raise RowProblem(INVALID_ROW, f"the id column {self.id_column!r} holds "
                                                  f"{'null' if value is None else repr(value)}: ids are "
                                                  "non-empty text or integers")
                row_id = value
            prompt = self.template.render(cells)
        except RowProblem as problem:
            return Row(raw.row, row_id, None, kept, (problem.code, f"row {raw.row}: {problem.message}"
                                                     if not problem.message.startswith("row ") else problem.message))
        return Row(raw.row, row_id, prompt, kept)

    def count(self) -> int | None:
        return self.table.count()

    def close(self) -> None:
        self.table.close()


def open_rows(path: str, template: str | None = None, *, system: str | None = None,
              messages: list[dict] | None = None, id_column: str | None = None,
              keep_columns: Sequence[str] | str | None = None, delimiter: str | None = None,
              max_cell_bytes: int = MAX_CELL_BYTES, environ: dict | None = None) -> RowReader:
    """The table at `path` checked and ready (see read_rows for the arguments). Raises TableError."""
    prompt = PromptTemplate(text=template, system=system, messages=messages)
    table = open_table(path, delimiter=delimiter, max_cell_bytes=max_cell_bytes, environ=environ)
    try:
        return RowReader(table, prompt, id_column=id_column, keep_columns=keep_columns)
    except BaseException:
        table.close()
        raise


def read_rows(path: str, template: str | None = None, *, system: str | None = None,
              messages: list[dict] | None = None, id_column: str | None = None,
              keep_columns: Sequence[str] | str | None = None, delimiter: str | None = None,
              max_cell_bytes: int = MAX_CELL_BYTES, environ: dict | None = None) -> Iterator[Row]:
    """Yield one Row per data row of the table at `path` (.csv, .tsv, .parquet, .arrow, .feather,
    a directory of Parquet shards, or hf:datasets/OWNER/NAME[/CONFIG][:SPLIT]).

    `template`: a str.format template whose fields are column names ("Summarize: {text}");
    `system`: a system prompt (a template too; the row then runs as chat); `messages`: chat
    messages whose contents are templates, instead of `template`. `id_column`: the column
    holding each row's id (default: the row number). `keep_columns`: columns copied into
    Row.columns ("all" for every one). The table is checked before the first row is yielded:
    TableError says what is wrong with it in one line."""
    reader = open_rows(path, template, system=system, messages=messages, id_column=id_column,
                       keep_columns=keep_columns, delimiter=delimiter, max_cell_bytes=max_cell_bytes,
                       environ=environ)
    return _rows(reader)


def _rows(reader: RowReader) -> Iterator[Row]:
    try:
        yield from reader.rows()
    finally:
        reader.close()
