"""`run` over a table (.csv, .tsv, .parquet, .arrow, .feather, a folder of Parquet shards, an
hf: dataset): the table's rows in the places where a prompts file's lines go.

The batch loop (batch_loop.py) reads `source.lines()` and hands each entry to `parser.parse`;
TableSource yields (row number, tables.Row) pairs and TableParser turns a Row into the
LineRequest or LineError a line would become, so admission, ordering, ids, --resume, the
writer and crash safety are the ones JSONL input has. Everything that can fail for the
whole table (no such file, no header, a template field naming no column, no pyarrow) fails
in `open_table_input`, before the model loads.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from ...params import SamplingParams
from ...tables import (PromptTemplate, Row, RowReader, TableError, is_table_input, load_messages_template,
                       load_template_file, open_table)
from ...openai_format import EmbedLine
from ..reading.input_source import BackgroundCount
from ...openai_format import LineError, LineRequest


@dataclass(frozen=True)
class TableOptions:
    """The table flags of `run`, as given."""

    template: str | None = None
    template_file: str | None = None
    messages_template: str | None = None
    id_column: str | None = None
    keep_columns: str | None = None  # "a,b" or "all"
    delimiter: str | None = None
    embed_column: str | None = None  # embed this column (the same as --embed --template '{COLUMN}')
    csv_formulas: str = "escape"  # a CSV/TSV OUTPUT's cells that start a formula: escape or raw (any INPUT)

    @property
    def given(self) -> list[str]:
        """The table-only flags that were given (for refusing them on a prompts file)."""
        names = {"template": "--template", "template_file": "--template-file",
                 "messages_template": "--messages-template", "id_column": "--id-column",
                 "keep_columns": "--keep-columns", "embed_column": "--embed-column"}
        return [flag for field, flag in names.items() if getattr(self, field) is not None]


def reads_table(input_path: str, options: TableOptions) -> bool:
    return is_table_input(input_path) or options.delimiter is not None


def keep_list(value: str | None) -> list[str] | str:
    if value is None:
        return []
    if value.strip() == "all":
        return "all"
    names = [c.strip() for c in value.split(",")]
    if not all(names):
        raise TableError(f"--keep-columns takes column names separated by commas, or all; got {value!r}")
    return list(dict.fromkeys(names))  # a name given twice is kept once: a table holds each column once


def prompt_template(options: TableOptions, system: str | None, columns: list[str], name: str) -> PromptTemplate:
    given = [f for f in ("template", "template_file", "messages_template", "embed_column")
             if getattr(options, f) is not None]
    if len(given) > 1:
        raise TableError("give one of --template, --template-file, --messages-template and --embed-column")
    if options.embed_column is not None:
        if options.embed_column not in columns:
            raise TableError(f"--embed-column {options.embed_column!r} is not a column of {name}; its columns: "
                             f"{', '.join(columns) if columns else '(none)'}")
        return PromptTemplate(text="{" + options.embed_column + "}", system=None)
    if options.messages_template is not None:
        return PromptTemplate(messages=load_messages_template(options.messages_template), system=system)
    if options.template_file is not None:
        return PromptTemplate(text=load_template_file(options.template_file), system=system)
    if options.template is not None:
        return PromptTemplate(text=options.template, system=system)
    if "prompt" in columns:  # the convention: a "prompt" column is the prompt as it is
        return PromptTemplate(text="{prompt}", system=system)
    raise TableError(f"INPUT {name} is a table: say how a row becomes a prompt with --template (e.g. "
                     f"--template 'Summarize: {{{columns[0] if columns else 'text'}}}'), --template-file or "
                     f"--messages-template; its columns: {', '.join(columns) if columns else '(none)'}")


def open_table_input(input_path: str, options: TableOptions, system: str | None, *,
                     keep_for_output: bool) -> RowReader:
    """The table opened and checked against its template. `keep_for_output`: --echo asked for the
    input in each record (without --keep-columns that means every column). Raises TableError."""
    table = open_table(input_path, delimiter=options.delimiter)
    try:
        keep = keep_list(options.keep_columns)
        if keep_for_output and not keep:
            keep = "all"
        template = prompt_template(options, system, table.columns, table.name)
        return RowReader(table, template, id_column=options.id_column, keep_columns=keep)
    except BaseException:
        table.close()
        raise


class TableSource:
    """The batch loop's Source for a table: (row number, Row) pairs instead of raw lines."""

    unit = "row"
    is_file = False  # no LineCounter: TableCounter counts rows
    read_bytes = 0

    def __init__(self, reader: RowReader):
        self.reader = reader
        self.name = reader.table.name
        # the first row is read now: an empty table is said before the run, and a table
        # whose first row group cannot be read shows it at once
        self._rows = reader.rows()
        self._first = next(self._rows, None)
        self.empty = self._first is None

    def lines(self) -> Iterator[tuple[int, Row]]:
        if self._first is None:
            return
        first, self._first = self._first, None
        yield first.row, first
        for row in self._rows:
            yield row.row, row

    def changed(self) -> tuple[str | None, str | None]:
        return None, None  # the readers keep the file they opened (or count its rows from footers)

    def close(self) -> None:
        self.reader.close()


class TableParser:
    """Row -> LineRequest (or LineError for a row that cannot be run), with the run's defaults."""

    def __init__(self, defaults: SamplingParams, *, echo: bool, embed: bool = False):
        self.defaults = defaults
        self.echo = echo  # copy the kept columns into each record's "input"
        self.embed = embed  # --embed-column, or --embed: each row's text is an embeddings input

    def parse(self, row: Row, line_no: int) -> LineRequest | LineError:
        echo = row.columns if self.echo else None
        if row.error is not None:
            code, message = row.error
            return LineError(line_no, row.id, code, message, echo=echo, row=row.row)
        if self.embed:
            if not isinstance(row.prompt, str):
                return LineError(line_no, row.id, "invalid_request", "embeddings take text: --messages-template "
                                 "makes chat messages; use --template or --embed-column", echo=echo, row=row.row)
            return LineRequest(line_no, row.id, row.prompt, self.defaults, echo=echo, row=row.row,
                               embed=EmbedLine(row.prompt))
        return LineRequest(line_no, row.id, row.prompt, self.defaults, echo=echo, row=row.row)


class TableCounter(BackgroundCount):
    """The progress total: the table's rows (CSV reads the file again; Parquet and Arrow add up
    their footers)."""

    def __init__(self, path: str, delimiter: str | None):
        super().__init__(lambda: _count_rows(path, delimiter))


def _count_rows(path: str, delimiter: str | None) -> int | None:
    try:
        table = open_table(path, delimiter=delimiter)
    except TableError:
        return None
    try:
        return table.count()
    finally:
        table.close()


def output_inside_input(output: str | None, input_path: str) -> bool:
    """An OUTPUT that is INPUT, or inside INPUT's folder of shards (the next run would read it)."""
    if output in (None, "-") or input_path.startswith("hf:"):
        return False
    out, src = os.path.realpath(output), os.path.realpath(input_path)
    return out == src or (os.path.isdir(src) and out.startswith(src.rstrip(os.sep) + os.sep))
