"""Writing a whole results table from rows (lists in Layout.columns order): CSV/TSV (stdlib
csv, spreadsheet formulas escaped unless --csv-formulas raw), Parquet (pyarrow, row groups as they fill), SQLite (WAL). Each takes the path to write,
the layout, an iterator of rows and a way to iterate them again (Parquet reads twice), holds at most one row group in memory, and returns
how many rows it wrote."""
from __future__ import annotations

import csv
import json
import os
import re
import sqlite3
from typing import Any, Callable, Iterable, Iterator

from ...tables.arrow_import import pyarrow_modules
from .table_layout import Layout

ROW_GROUP = 10_000  # Parquet rows per row group; SQLite rows per transaction


def _text(value: Any) -> Any:
    """A non-scalar kept cell (a list, a struct) as JSON text: tables hold scalars."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (list, dict)) else value


def _chunks(rows: Iterable[list], size: int) -> Iterator[list[list]]:
    chunk: list[list] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# OWASP's CSV injection advice: a spreadsheet runs a cell beginning with one of these as a
# formula (=HYPERLINK(...) from a row's own text, say), so such a cell gets a leading ' and
# shows as the text it is. A plain number (-5, +3.25, -1e5) is left alone: it is no formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
CSV_FORMULAS = ("escape", "raw")  # --csv-formulas
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def formula_safe(cell: str) -> str:
    """`cell` as a spreadsheet shows it as text: with a leading ' when it would start a formula."""
    if cell.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(cell):
        return "'" + cell
    return cell


def write_csv(path: str, layout: Layout, rows: Iterable[list], again: Any = None, delimiter: str = ",",
              formulas: str = "escape") -> int:
    """`formulas`: "escape" writes text cells through formula_safe (the header too: its names
    come from the input), "raw" as they are."""
    safe = formula_safe if formulas == "escape" else (lambda cell: cell)
    n = 0
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow([safe(name) for name in layout.columns])
        for row in rows:
            cells = ["" if v is None else ("true" if v is True else "false" if v is False else _text(v)) for v in row]
            w.writerow([safe(c) if isinstance(c, str) else c for c in cells])
            n += 1
        f.flush()
        os.fsync(f.fileno())
    return n


def write_tsv(path: str, layout: Layout, rows: Iterable[list], again: Any = None, formulas: str = "escape") -> int:
    return write_csv(path, layout, rows, delimiter="\t", formulas=formulas)


def _arrow_type(pa: Any, kinds: set) -> Any:
    if not kinds:
        return pa.string()
    if kinds == {bool}:
        return pa.bool_()
    if kinds == {int}:
        return pa.int64()
    if kinds <= {int, float}:
        return pa.float64()
    return pa.string()


def write_parquet(path: str, layout: Layout, rows: Iterable[list], again: Callable[[], Iterable[list]]) -> int:
    """Row groups of ROW_GROUP rows. A first pass over `again()` fixes each column's type (an int
    column stays int64; a column mixing kinds becomes text), so every row group fits one schema."""
    pa, pq, _ipc = pyarrow_modules(f"writing Parquet ({path})")
    columns = layout.columns
    kinds: list[set] = [set() for _ in columns]
    for row in again():
        for i, v in enumerate(row):
            if v is not None:
                kinds[i].add(type(v))
    schema = pa.schema([(name, _arrow_type(pa, kinds[i])) for i, name in enumerate(columns)])
    n = 0
    with pq.ParquetWriter(path, schema) as writer:
        for chunk in _chunks(rows, ROW_GROUP):
            arrays = []
            for i, field in enumerate(schema):
                values = [r[i] for r in chunk]
                if field.type == pa.string():
                    values = [None if v is None else v if isinstance(v, str) else str(_text(v)) for v in values]
                arrays.append(pa.array(values, type=field.type))
            writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
            n += len(chunk)
    return n


def _sqlite_type(name: str) -> str:
    return {"row": "INTEGER", "prompt_tokens": "INTEGER", "completion_tokens": "INTEGER"}.get(name, "")


def write_sqlite(path: str, layout: Layout, rows: Iterable[list], again: Any = None) -> int:
    """A `results` table, one row per input row, in WAL mode (readers can query it while a later
    run replaces it)."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    columns = layout.columns
    db = sqlite3.connect(path)
    n = 0
    try:
        db.execute("PRAGMA journal_mode=WAL")
        quoted = ", ".join(f'"{c.replace(chr(34), chr(34) * 2)}" {_sqlite_type(c)}'.rstrip() for c in columns)
        db.execute(f"CREATE TABLE results ({quoted})")
        insert = f"INSERT INTO results VALUES ({', '.join('?' for _ in columns)})"
        for chunk in _chunks(rows, ROW_GROUP):
            db.executemany(insert, [[_text(v) for v in r] for r in chunk])
            db.commit()
            n += len(chunk)
        if layout.rows:
            db.execute("CREATE INDEX results_row ON results(row)")
        db.commit()
    finally:
        db.close()
    return n


WRITERS = {"csv": write_csv, "tsv": write_tsv, "parquet": write_parquet, "sqlite": write_sqlite}
