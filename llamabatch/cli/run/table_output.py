"""`run -o results.csv|.tsv|.parquet|.sqlite|.db`: the results as a table, one row per input row.

Crash safety is JSONL's, not a second mechanism: the run writes its JSONL records to the
*records file* beside the table (`results.csv.records.jsonl`): every record whole and
flushed as it finishes, read back by --resume, locked, with its manifest. The table is made
from the records file when the run ends (finished or stopped), written to a temporary name
and renamed over OUTPUT, so OUTPUT is always a whole table: a kill -9 loses no answered
row (they are in the records file) and the next `--resume` runs the rest and writes the
table again, complete. Keep the records file: it is what a resume reads.

Table columns: `row` (table inputs), `id`, the --keep-columns (a kept column named like an
output column gets an `input.` prefix), then `response`, `finish_reason`, `error_code`,
`error`, `prompt_tokens`, `completion_tokens`, and `logprobs` (JSON text) when the run asked
for logprobs. Rows are in input order (sorted by row number) with --order input.
"""
from __future__ import annotations

import json
import os
from array import array
from typing import Any, Iterator

from .formats import record_error_code, record_id
from .table_layout import Layout
from .table_writers import WRITERS

TABLE_OUTPUTS = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".sqlite": "sqlite", ".db": "sqlite"}
RECORDS_SUFFIX = ".records.jsonl"


def table_kind(output: str | None) -> str | None:
    """"csv", "tsv", "parquet" or "sqlite" when OUTPUT's extension asks for a table; else None (JSONL)."""
    if output in (None, "-"):
        return None
    return TABLE_OUTPUTS.get(os.path.splitext(output)[1].lower())


def records_path(table: str) -> str:
    return table + RECORDS_SUFFIX


def _response(record: dict) -> str | None:
    if "embeddings" in record:  # an embeddings line: its vector (one input) as JSON text
        vectors = record["embeddings"]
        return json.dumps(vectors[0] if len(vectors) == 1 else vectors)
    if "text" in record:
        return record.get("text")
    body = (record.get("response") or {}).get("body") or {}  # an OpenAI Batch line's record
    choices = body.get("choices") or [{}]
    first = choices[0]
    return (first.get("message") or {}).get("content") if "message" in first else first.get("text")


def table_row(record: dict, layout: Layout) -> list[Any]:
    """One record as the table's row, in layout.columns order."""
    error = record.get("error") if isinstance(record.get("error"), dict) else None
    usage = record.get("usage") or ((record.get("response") or {}).get("body") or {}).get("usage") or {}
    kept = record.get("input") if isinstance(record.get("input"), dict) else {}
    out: list[Any] = [record.get("row")] if layout.rows else []
    out.append(record_id(record))
    out += [kept.get(c) for c in layout.keep]
    out += [_response(record) if error is None else None, record.get("finish_reason"),
            record_error_code(record), error.get("message") if error else None,
            usage.get("prompt_tokens"), usage.get("completion_tokens")]
    if layout.logprobs:
        out.append(json.dumps(record["logprobs"], ensure_ascii=False) if record.get("logprobs") is not None else None)
    return out


def _index(path: str) -> tuple[array, array, bool]:
    """Each whole record's row number and byte offset (8 bytes each: a million rows is 16 MB),
    and whether they are in row order already."""
    rows, offsets = array("q"), array("q")
    in_order = True
    last = -1
    offset = 0
    with open(path, "rb") as f:
        for raw in f:
            if raw.endswith(b"\n") and raw.strip():
                row = json.loads(raw).get("row")
                row = -1 if not isinstance(row, int) else row
                if row < last:
                    in_order = False
                last = row
                rows.append(row)
                offsets.append(offset)
            offset += len(raw)
    return rows, offsets, in_order


def records(path: str, in_input_order: bool) -> Iterator[dict]:
    """The records file's whole records; sorted by row number when `in_input_order` (a resume
    after a cancelled line appends its answer after later rows). A torn last line is no record."""
    rows, offsets, in_order = _index(path)
    with open(path, "rb") as f:
        if not in_input_order or in_order:
            for offset in offsets:
                f.seek(offset)
                yield json.loads(f.readline())
            return
        for i in sorted(range(len(rows)), key=rows.__getitem__):  # stable: equal rows keep file order
            f.seek(offsets[i])
            yield json.loads(f.readline())


def finalize(records_file: str, table: str, kind: str, layout: Layout, *, in_input_order: bool) -> int:
    """Write the table from the records file: to a temporary name, then renamed over `table`.
    Returns the rows written. Raises OSError (or the writer's error) and leaves `table` as it was."""
    tmp = table + ".tmp"
    try:
        def rows() -> Iterator[list]:
            return (table_row(r, layout) for r in records(records_file, in_input_order))

        count = WRITERS[kind](tmp, layout, rows(), rows)
        if kind == "sqlite":
            for leftover in (table + "-wal", table + "-shm"):  # the old database's: they'd spoil the new one
                try:
                    os.remove(leftover)
                except FileNotFoundError:
                    pass
        os.replace(tmp, table)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return count
