"""`run -o results.csv|.tsv|.parquet|.sqlite|.db`: the results as a table, one row per input row.

Crash safety is JSONL's, not a second mechanism: the run writes its JSONL records to the
*records file* beside the table (`results.csv.records.jsonl`): every record whole and
flushed as it finishes, read back by --resume, locked, with its manifest. The table is made
from the records file when the run ends (finished or stopped), written to a temporary name
and renamed over OUTPUT, so OUTPUT is always a whole table: a kill -9 loses no answered
row (they are in the records file) and the next `--resume` runs the rest and writes the
table again, complete. Keep the records file: it is what a resume reads.

Table columns: `row` (table inputs), `id`, the --keep-columns (a kept column named like an
output column gets an `input.` prefix: table_layout.py), then `response`, `finish_reason`, `error_code`,
`error`, `prompt_tokens`, `completion_tokens`, `logprobs` (JSON text) when the run asked
for logprobs, `tool_calls` (OpenAI's calls as JSON text) when some answer made calls, and
`reasoning` (a thinking model's reasoning block) when some answer had one. Rows are in input order (sorted by row number) with --order input.
"""
from __future__ import annotations

import functools
import json
import os
import re
from array import array
from dataclasses import replace
from typing import Any, Iterator

from ...openai_format import output_text, reasoning_text as response_reasoning, record_error_code, record_id
from .table_layout import Layout
from ...files.replaced_file import replacing
from .sqlite_output import refuse_foreign
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


def response_text(record: dict) -> str | None:
    """A record's answer as a table cell: the text (an answer of calls alone: none), or an
    embeddings line's vector as JSON text."""
    if "embeddings" in record:  # an embeddings line: its vector (one input) as JSON text
        vectors = record["embeddings"]
        return json.dumps(vectors[0] if len(vectors) == 1 else vectors)
    if "text" in record:
        return None if record.get("tool_calls") and not record.get("text") else record.get("text")
    body = (record.get("response") or {}).get("body") or {}  # an OpenAI Batch line's record
    if body.get("object") == "response":  # a /v1/responses line: its message items' text
        return output_text(body) if any(i.get("type") == "message" for i in body.get("output", [])) else None
    choices = body.get("choices") or [{}]
    first = choices[0]
    if "message" in first:
        message = first.get("message") or {}
        return message.get("content")
    return first.get("text")


def calls_text(record: dict) -> str | None:
    """A record's tool calls as their cell: OpenAI's calls as JSON text, or None without calls
    (n > 1: one list per sample)."""
    calls = record.get("tool_calls")
    body = (record.get("response") or {}).get("body") or {}
    if calls is None and body.get("object") == "response":  # a /v1/responses line's function_call items
        calls = [{k: item[k] for k in ("call_id", "name", "arguments")} for item in body.get("output", [])
                 if item.get("type") == "function_call"]
    if calls is None:
        messages = [c.get("message") or {} for c in body.get("choices") or []]
        calls = [m.get("tool_calls") or [] for m in messages]
        calls = calls[0] if len(calls) == 1 else calls
    return json.dumps(calls, ensure_ascii=False) if any(calls) else None


def finish_text(record: dict) -> str | None:
    """A record's finish_reason cell: a plain record's own, an OpenAI Batch line's first choice's,
    or a response's as chat would say it (length when cut, tool_calls when it called)."""
    if "finish_reason" in record:
        return record["finish_reason"]
    body = (record.get("response") or {}).get("body") or {}
    if body.get("object") == "response":
        if body.get("status") == "incomplete":
            return "length"
        called = any(item.get("type") == "function_call" for item in body.get("output", []))
        return ("tool_calls" if called else "stop") if body.get("status") == "completed" else None
    choices = body.get("choices") or [{}]
    return choices[0].get("finish_reason")


def table_row(record: dict, layout: Layout) -> list[Any]:
    """One record as the table's row, in layout.columns order."""
    error = record.get("error") if isinstance(record.get("error"), dict) else None
    usage = record.get("usage") or ((record.get("response") or {}).get("body") or {}).get("usage") or {}
    if "input_tokens" in usage:  # a /v1/responses line's usage
        usage = {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage.get("output_tokens")}
    kept = record.get("input") if isinstance(record.get("input"), dict) else {}
    out: list[Any] = [record.get("row")] if layout.rows else []
    out.append(record_id(record))
    out += [kept.get(c) for c in layout.keep]
    out += [response_text(record) if error is None else None, finish_text(record),
            record_error_code(record), error.get("message") if error else None,
            usage.get("prompt_tokens"), usage.get("completion_tokens")]
    if layout.logprobs:
        out.append(json.dumps(record["logprobs"], ensure_ascii=False) if record.get("logprobs") is not None else None)
    if layout.tool_calls:
        out.append(calls_text(record) if error is None else None)
    if layout.reasoning:
        out.append(reasoning_text(record) if error is None else None)
    return out


def reasoning_text(record: dict) -> str | None:
    """A record's reasoning cell: a plain record's `reasoning`, a chat body's `reasoning_content`, a
    response's reasoning items."""
    if "reasoning" in record:
        value = record["reasoning"]
        return value if isinstance(value, str) or value is None else json.dumps(value, ensure_ascii=False)
    body = (record.get("response") or {}).get("body") or {}
    if body.get("object") == "response":  # a /v1/responses line's reasoning items
        return response_reasoning(body)
    choices = body.get("choices") or [{}]
    return (choices[0].get("message") or {}).get("reasoning_content")


def _any_reasoning(path: str) -> bool:
    """Whether some record of the records file is a thinking answer's (its table gets the column)."""
    return any((b'"reasoning' in raw) and reasoning_text(json.loads(raw)) is not None
               for _offset, raw in _whole_lines(path))


def _any_calls(path: str) -> bool:
    """Whether some record of the records file made a tool call (its table gets the column)."""
    return any((b'"tool_calls"' in raw or b'"function_call"' in raw) and calls_text(json.loads(raw)) is not None
               for _offset, raw in _whole_lines(path))


# A record's own "row" key: the first `"row": N` on its line. Records start {"id": ..., "row": N,
# and a quote inside a JSON string is always escaped, so nothing before the key can match.
_ROW = re.compile(rb'"row": (\d+)')


def _row_of(raw: bytes) -> int:
    m = _ROW.search(raw)
    return int(m.group(1)) if m else -1


def _whole_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line) of each whole record; a torn last line (a kill mid-write) is none."""
    offset = 0
    with open(path, "rb") as f:
        for raw in f:
            if raw.endswith(b"\n") and raw.strip():
                yield offset, raw
            offset += len(raw)


def _in_row_order(path: str) -> bool:
    last = -1
    for _offset, raw in _whole_lines(path):
        row = _row_of(raw)
        if row < last:
            return False
        last = row
    return True


def records(path: str, in_input_order: bool) -> Iterator[dict]:
    """The records file's whole records, streamed. With `in_input_order`, sorted by row number
    when they are not in order already (a resume after a cancelled line appends its answer
    after later rows): only then an index is built, 16 bytes per record."""
    if not in_input_order or _in_row_order(path):
        for _offset, raw in _whole_lines(path):
            yield json.loads(raw)
        return
    rows, offsets = array("q"), array("q")
    for offset, raw in _whole_lines(path):
        rows.append(_row_of(raw))
        offsets.append(offset)
    with open(path, "rb") as f:
        for i in sorted(range(len(rows)), key=rows.__getitem__):  # stable: equal rows keep file order
            f.seek(offsets[i])
            yield json.loads(f.readline())


def finalize(records_file: str, table: str, kind: str, layout: Layout, *, in_input_order: bool,
             csv_formulas: str = "escape") -> int:
    """Write the table from the records file: to a temporary name, then renamed over `table`.
    Returns the rows written. Raises OSError (or the writer's error) and leaves `table` as it was.
    `csv_formulas`: --csv-formulas, for CSV and TSV (table_writers.formula_safe)."""
    layout = replace(layout, tool_calls=_any_calls(records_file), reasoning=_any_reasoning(records_file))

    def rows() -> Iterator[list]:
        return (table_row(r, layout) for r in records(records_file, in_input_order))

    writer = WRITERS[kind]
    if kind in ("csv", "tsv"):
        writer = functools.partial(writer, formulas=csv_formulas)
    with replacing(table) as tmp:
        count = writer(tmp, layout, rows(), rows)
        if kind == "sqlite":
            refuse_foreign(table)  # checked before the run too; this is what the rename would destroy now
            real = os.path.realpath(table)  # a link's target is the database replaced (replaced_file.py)
            for leftover in (real + "-wal", real + "-shm"):  # the old database's: they'd spoil the new one
                try:
                    os.remove(leftover)
                except FileNotFoundError:
                    pass
    return count
