"""`run_frame`: a pandas or polars DataFrame through a job, one answer per row, in order.

The frame goes to the job as an Arrow table (the frame's own library converts it: neither
pandas nor polars is a dependency; pyarrow comes from the `tables` extra), so its rows are a
table INPUT exactly as `llamabatch run rows.arrow` reads them: `template` is the same Python
str.format template over the row's columns (docs/tables.md). The records are read back by
row number into two new columns: the answer (None for a row without one), and `error` (None
for a row that was answered).
"""
from __future__ import annotations

import math
import os
import tempfile
from typing import Any, Callable

from ..errors import InvalidRequest
from ..tables.arrow_import import pyarrow_modules
from .job import run_job
from .tables.table_output import records, response_text

ERROR_COLUMN = "error"
NOT_RUN = "not run: the job stopped before this row (cancelled or interrupted)"


def _library(frame: Any) -> str:
    """"pandas" or "polars": which library the frame is of (by its type's module, so neither is imported here)."""
    module = type(frame).__module__.split(".")[0]
    if module in ("pandas", "polars") and type(frame).__name__ == "DataFrame":
        return module
    raise InvalidRequest(f"run_frame takes a pandas or polars DataFrame, got {type(frame).__module__}."
                         f"{type(frame).__name__}")


def _to_arrow(frame: Any, library: str) -> Any:
    pyarrow, _parquet, _ipc = pyarrow_modules("run_frame")
    if library != "pandas":
        return frame.to_arrow()  # a polars column has one type: it always converts
    try:
        return pyarrow.Table.from_pandas(frame, preserve_index=False)
    except pyarrow.ArrowException as exc:  # an object column pyarrow can't type: say which, in our words
        raise _unconvertible_column(frame, pyarrow, exc) from None


def _unconvertible_column(frame: Any, pyarrow: Any, exc: Exception) -> InvalidRequest:
    for i, name in enumerate(frame.columns):
        values = frame.iloc[:, i]
        try:
            pyarrow.array(values, from_pandas=True)
        except pyarrow.ArrowException as column_exc:
            kinds = sorted({type(v).__name__ for v in values if not _missing(v)})
            if len(kinds) > 1:
                return InvalidRequest(f"run_frame: column {name!r} holds values of {len(kinds)} types "
                                      f"({', '.join(kinds)}): an Arrow column takes one; convert it first, "
                                      f"e.g. frame[{name!r}].astype(str)")
            return InvalidRequest(f"run_frame: column {name!r} can't be converted to Arrow: {column_exc}")
    return InvalidRequest(f"run_frame: the frame can't be converted to Arrow: {exc}")


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _with_answers(frame: Any, library: str, column: str, answers: list, errors: list) -> Any:
    if library == "pandas":
        import pandas

        out = frame.copy()
        # object columns keep None as None: pandas 3 would infer its string dtype, whose missing
        # value is NaN, and NaN is true where `if row.error:` expects None
        out[column] = pandas.Series(answers, index=out.index, dtype=object)
        out[ERROR_COLUMN] = pandas.Series(errors, index=out.index, dtype=object)
        return out
    import polars

    return frame.with_columns(polars.Series(column, answers, dtype=polars.Utf8),
                              polars.Series(ERROR_COLUMN, errors, dtype=polars.Utf8))


def run_frame(frame: Any, template: str | None = None, column: str = "answer", *, engine: Any = None,
              on_event: Callable[[Any], None] | None = None, **settings: Any) -> Any:
    """A new frame of the same library: `frame`'s columns, then `column` (each row's answer,
    in row order; None for a row without one) and `error` (why a row has no answer; None when
    it has one). `template`:
    a str.format template whose fields are column names, e.g. "Classify: {review}" (None: the
    frame's "prompt" column as it is). Settings are run_job's (model, temperature, ...)."""
    library = _library(frame)
    for name in (column, ERROR_COLUMN):
        if name in frame.columns:
            raise InvalidRequest(f"the frame has a column {name!r} already: name the answers' column with column=, "
                                 "or rename it")
    for key in ("resume", "output", "error_file", "retry_failed", "keep_columns", "echo", "id_column"):
        if settings.get(key):
            raise InvalidRequest(f"run_frame writes no files of its own: {key} is not one of its settings")
    table = _to_arrow(frame, library)
    _pyarrow, _parquet, ipc = pyarrow_modules("run_frame")
    with tempfile.TemporaryDirectory(prefix="llamabatch-frame-") as folder:
        rows = os.path.join(folder, "rows.arrow")
        with ipc.new_file(rows, table.schema) as writer:
            writer.write_table(table)
        out = os.path.join(folder, "records.jsonl")
        run_job(rows, out, engine=engine, on_event=on_event, template=template, **settings)
        answers: list = [None] * table.num_rows
        errors: list = [NOT_RUN] * table.num_rows
        for record in records(out, in_input_order=True):
            row = record.get("row")
            error = record.get("error")
            if isinstance(row, int) and 1 <= row <= table.num_rows:
                answers[row - 1] = response_text(record) if not isinstance(error, dict) else None
                errors[row - 1] = f"{error.get('code')}: {error.get('message')}" if isinstance(error, dict) else None
    return _with_answers(frame, library, column, answers, errors)
