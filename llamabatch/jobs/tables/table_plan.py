"""What a `run` invocation does with tables, decided once before the model loads: whether
INPUT is a table (its reader, parser and row counter: table_input.py), whether OUTPUT is one
(its records file and columns: table_output.py), and making the table when the run ends.

With neither, `records_output` is OUTPUT itself and `run` is the prompts-file command it
always was.
"""
from __future__ import annotations

import os
from typing import Any

from ...params import SamplingParams
from ...tables import TableError
from ...tables.arrow_import import pyarrow_modules, use_system_allocator
from ...tables.csv_table import CsvTable
from ...errors import InvalidRequest, JobFileError
from .table_input import (TableCounter, TableParser, TableSource, open_table_input, output_inside_input,
                          reads_table)
from .sqlite_output import NotOurDatabase, refuse_foreign
from .table_layout import Layout
from .table_output import finalize, records_path, table_kind

SMALL_CSV_BYTES = 4 << 20  # a CSV this small is counted up front (for the slot count); larger ones in the background


class TablePlan:
    def __init__(self, *, output: str | None, kind: str | None, source: TableSource | None = None,
                 parser: TableParser | None = None, layout: Layout | None = None, delimiter: str | None = None,
                 input_path: str = "", csv_formulas: str = "escape"):
        self.output = output
        self.kind = kind  # csv, tsv, parquet, sqlite: OUTPUT is a table; None: JSONL
        self.source = source  # INPUT's rows when it is a table
        self.parser = parser
        self.layout = layout
        self.delimiter = delimiter
        self.input_path = input_path
        self.csv_formulas = csv_formulas  # --csv-formulas: escape or raw (table_writers.formula_safe)
        self.empty_note: str | None = None
        if source is not None and source.empty:
            self.empty_note = f"INPUT {source.name} has no data rows: nothing to run"

    @property
    def identity(self) -> dict[str, Any] | None:
        """How rows become prompts and ids, for the resume fingerprint (None: not a table INPUT)."""
        if self.source is None:
            return None
        reader = self.source.reader
        return {"template": reader.template.text, "messages": reader.template.messages,
                "id_column": reader.id_column}

    @property
    def reads_table(self) -> bool:
        return self.source is not None

    @property
    def records_output(self) -> str | None:
        """Where the JSONL records go: OUTPUT, or a table OUTPUT's records file."""
        return records_path(self.output) if self.kind is not None else self.output

    def rows_up_to(self, cap: int) -> int | None:
        """The row count when it is cheap to know (it bounds the slot count), capped at `cap`."""
        if self.source is None:
            return None
        table = self.source.reader.table
        if isinstance(table, CsvTable):
            try:
                if os.path.getsize(table.name) > SMALL_CSV_BYTES:
                    return None
            except OSError:
                return None
        n = table.count()
        return None if n is None else min(n, cap)

    def counter(self) -> TableCounter | None:
        return TableCounter(self.input_path, self.delimiter) if self.source is not None else None

    def write_table(self, order: str) -> int | None:
        """Write the table from the records file (finished or stopped): the rows written, None
        when there is no records file. Raises JobFileError, the records kept for the next resume."""
        records = self.records_output
        if not os.path.exists(records):
            return None
        try:
            return finalize(records, self.output, self.kind, self.layout, in_input_order=order == "input",
                            csv_formulas=self.csv_formulas)
        except Exception as exc:
            raise JobFileError(f"cannot write the table {self.output}: {getattr(exc, 'strerror', None) or exc}; "
                               f"the answers are kept in {records}, and --resume writes the table again") from None

    def close(self) -> None:
        if self.source is not None:
            self.source.close()


def plan_tables(o: Any, sampling: SamplingParams) -> TablePlan:
    """Check and open what the table flags ask for. Raises InvalidRequest or JobFileError (one line) before anything loads."""
    t = o.tables
    kind = table_kind(o.output)
    is_table = o.input_format == "auto" and reads_table(o.input_path, t)
    if not is_table and t.given:
        raise InvalidRequest(f"{', '.join(t.given)} read a table INPUT (.csv, .tsv, .parquet, .arrow, .feather, a "
                             f"folder of Parquet shards, hf:datasets/...); {o.input_path} is read as a prompts file")
    if is_table and o.input_path != "-" and output_inside_input(o.output, o.input_path):
        raise JobFileError(f"OUTPUT {o.output} is the INPUT {'file' if not os.path.isdir(o.input_path) else 'folder'} "
                           "or inside it; write the results somewhere else")
    if kind is not None and o.output is not None and os.path.isdir(o.output):
        raise JobFileError(f"cannot write OUTPUT {o.output}: is a directory")
    if kind == "sqlite" and o.output is not None:
        try:
            refuse_foreign(o.output)  # another program's database is not ours to replace
        except NotOurDatabase as exc:
            raise InvalidRequest(str(exc)) from None
    if kind == "parquet":
        try:
            pyarrow_modules(f"writing Parquet ({o.output})")
            use_system_allocator()
        except TableError as exc:
            raise JobFileError(str(exc)) from None
    logprobs = sampling.logprobs is not None
    if not is_table:
        layout = Layout((), logprobs, rows=False) if kind is not None else None
        return TablePlan(output=o.output, kind=kind, layout=layout, csv_formulas=t.csv_formulas)
    try:
        reader = open_table_input(o.input_path, t, o.system, keep_for_output=o.echo)
        if not isinstance(reader.table, CsvTable):
            use_system_allocator()  # flat memory over big row groups (arrow_import.py)
    except TableError as exc:
        raise JobFileError(str(exc)) from None
    layout = Layout(tuple(reader.keep), logprobs, rows=True)
    clash = layout.clashes(fold_case=kind == "sqlite") if kind is not None else []
    if clash:  # a table with a name twice is unreadable (Parquet) or cannot be made (SQLite)
        reader.close()
        raise JobFileError(_clash_message(clash, layout, kind, o.output))
    try:
        source = TableSource(reader)
    except BaseException:
        reader.close()
        raise
    parser = TableParser(sampling, echo=bool(reader.keep), embed=bool(getattr(o, "embed", False) or t.embed_column))
    return TablePlan(output=o.output, kind=kind, source=source, parser=parser, layout=layout,
                     delimiter=t.delimiter, input_path=o.input_path, csv_formulas=t.csv_formulas)


def _clash_message(clash: list[list[str]], layout: Layout, kind: str, output: str) -> str:
    group = clash[0]
    why = " (SQLite does not tell names apart by case)" if kind == "sqlite" else ""
    renamed = [c for c in group if layout.kept_name(c) != c]
    if renamed:
        why += (f"; {', '.join(map(repr, renamed))} {'is' if len(renamed) == 1 else 'are'} an output column's "
                "name, so kept with an 'input.' prefix")
    return (f"--keep-columns: the columns {' and '.join(map(repr, group))} would "
            f"{'both' if len(group) == 2 else 'all'} be named "
            f"{layout.kept_name(group[0])!r} in OUTPUT {output}{why}; keep one of them (name the columns "
            "to keep with --keep-columns A,B), or write JSONL records")
