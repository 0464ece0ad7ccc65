"""`run --resume --retry-failed`: run again the lines whose record is a retryable error, and
put each new record in the old one's place without ever leaving an id with two records.

Retried (RETRYABLE): errors of the moment, not of the line: `timeout` (raise --timeout and
retry), `engine_crashed` (the engine process died with the line in flight),
`engine_unavailable`, `engine_error` and `decode_error` (llama.cpp failed a batch, e.g. a
full KV cache), `queue_full`, `engine_closed`. Never retried: errors of the line itself
(invalid_json, unknown_shape, invalid_url, invalid_request, duplicate_id, context_overflow,
resource_limit, determinism_unavailable: the same line fails the same way), internal_error
(a bug: rerunning hides it), and `length` (not an error: the answer is complete for its
max_tokens; rerunning gives the same text).

How it stays crash-safe: the retried lines' new records never go straight into OUTPUT (or
the error file). They are appended to a journal, `OUTPUT.retry.jsonl`, flushed per record
like OUTPUT. When the run ends (finished or stopped) the journal is merged:
  inline (no --error-file): OUTPUT is rewritten to a temporary file with each retried id's
  record replaced in place by its journal record, fsynced, and renamed over OUTPUT (one
  atomic step); then the journal is removed.
  with --error-file: the error file is rewritten the same way with retried ids that now
  succeeded dropped (and those that failed again replaced) and renamed over it; then the
  successes the journal holds that OUTPUT lacks are appended to OUTPUT; then the journal
  is removed.
The merge is idempotent: a journal record replaces only a record that is still a
retryable error, and is appended only where its id has no record. Every --resume on OUTPUT
first finishes a merge a kill left undone (--dry-run --resume only reports it), so a kill -9 at any point loses no answer (it is in OUTPUT, the error file or the
journal) and no id ever has two records in OUTPUT and the error file together (between
the error-file rename and the append a success is only in the journal).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ...files.replaced_file import replacing, sync_folder
from ...openai_format import record_error_code, record_id
from .id_sets import Answered, IdSet, id_key

RETRYABLE = frozenset({"timeout", "engine_crashed", "engine_unavailable", "engine_error", "decode_error",
                       "queue_full", "engine_closed"})
JOURNAL_SUFFIX = ".retry.jsonl"


def journal_path(output: str) -> str:
    return output + JOURNAL_SUFFIX


def is_retryable(record: Any) -> bool:
    return isinstance(record, dict) and record_error_code(record) in RETRYABLE


def is_error(record: Any) -> bool:
    return isinstance(record, dict) and isinstance(record.get("error"), dict)


def whole_records(path: str) -> Iterator[tuple[bytes, Any]]:
    """(raw line, parsed record or None) for each whole line of `path` (a torn last line,
    without its newline, is left out: it is no record). Nothing when the file is missing."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                record = None
            yield raw, record


def retryable_ids(*paths: str | None) -> IdSet:
    """The ids whose record in these files is a retryable error."""
    ids = IdSet()
    for path in paths:
        if path:
            for _raw, record in whole_records(path):
                if is_retryable(record):
                    line_id = record_id(record)
                    if line_id is not None:
                        ids.add(line_id)
    return ids


class RetryAnswered:
    """OUTPUT's answers as --resume reads them, less the retryable errors: those lines run again."""

    def __init__(self, answered: Answered, retry: IdSet):
        self.answered = answered
        self.retry = retry
        self.records = answered.records
        self.retried = 0  # input lines that were sent again

    def covers(self, line_id: Any, first_use: bool) -> bool:
        if first_use and line_id in self.retry:
            self.retried += 1
            return False
        return self.answered.covers(line_id, first_use)


# -- the merge ------------------------------------------------------------------------------

@dataclass
class Merged:
    replaced: int = 0  # retried ids whose journal record took their old record's place
    appended: int = 0  # journal records added where their id had no record


def _journal(path: str) -> dict[bytes, tuple[bytes, Any]]:
    records: dict[bytes, tuple[bytes, Any]] = {}
    for raw, record in whole_records(path):
        line_id = record_id(record)
        if line_id is not None:
            records[id_key(line_id)] = (raw, record)
    return records


def _rewrite(path: str, keep: Callable[[bytes, Any], bytes | None], tail: list[bytes]) -> None:
    """Replace `path` atomically by its whole lines passed through `keep` (None drops one),
    then `tail`. A missing file is created."""
    with replacing(path) as tmp, open(tmp, "wb") as out:
        for raw, record in whole_records(path):
            new = keep(raw, record)
            if new is not None:
                out.write(new)
        for raw in tail:
            out.write(raw)
        out.flush()
        os.fsync(out.fileno())
    sync_folder(os.path.dirname(os.path.abspath(path)))


def merge_journal(output: str, error_file: str | None = None) -> Merged | None:
    """Merge `OUTPUT.retry.jsonl` into OUTPUT (and the error file); None when there is none.
    Safe to run again after a kill at any point. Raises OSError (the journal then stays)."""
    jpath = journal_path(output)
    if not os.path.exists(jpath):
        return None
    journal = _journal(jpath)
    merged = Merged()
    used: set[bytes] = set()
    present: set[bytes] = set()  # journal ids that already have a record where it belongs

    def replace_in_place(drop_successes: bool) -> Callable[[bytes, Any], bytes | None]:
        def keep(raw: bytes, record: Any) -> bytes | None:
            line_id = record_id(record)
            key = id_key(line_id) if line_id is not None else None
            if key is None or key not in journal:
                return raw
            present.add(key)
            if not is_retryable(record):
                return raw  # merged before a kill, or answered otherwise: keep it, one record per id
            new_raw, new_record = journal[key]
            used.add(key)
            merged.replaced += 1
            if drop_successes and not is_error(new_record):
                return None  # its success goes to OUTPUT below
            return new_raw
        return keep

    if error_file is None:
        _rewrite(output, replace_in_place(False), [])
        lost = [raw for key, (raw, _r) in journal.items() if key not in present]
        if lost:  # a retried id with no record at all (OUTPUT edited meanwhile): keep its answer
            with open(output, "ab") as f:
                f.writelines(lost)
                f.flush()
                os.fsync(f.fileno())
            merged.appended += len(lost)
    else:
        _rewrite(error_file, replace_in_place(True), [])
        errors_lost = [raw for key, (raw, record) in journal.items() if is_error(record) and key not in present]
        if errors_lost:
            with open(error_file, "ab") as f:
                f.writelines(errors_lost)
                f.flush()
                os.fsync(f.fileno())
            merged.appended += len(errors_lost)
        successes = {key: raw for key, (raw, record) in journal.items() if not is_error(record)}
        merged.appended += _append_missing(output, successes)
    os.remove(jpath)
    sync_folder(os.path.dirname(os.path.abspath(jpath)))
    return merged


def _whole_length(path: str) -> int:
    """Bytes up to the end of the last whole line (0 for a missing file)."""
    n = 0
    try:
        with open(path, "rb") as f:
            for raw in f:
                if raw.endswith(b"\n"):
                    n += len(raw)
    except FileNotFoundError:
        pass
    return n


def _append_missing(path: str, records: dict[bytes, bytes]) -> int:
    """Append the records whose id `path` does not hold yet, after cutting a torn last line."""
    if not records:
        return 0
    have: set[bytes] = set()
    for _raw, record in whole_records(path):
        line_id = record_id(record)
        if line_id is not None and id_key(line_id) in records:
            have.add(id_key(line_id))
    good_end = _whole_length(path)
    missing = [raw for key, raw in records.items() if key not in have]
    with open(path, "ab") as f:
        if f.tell() != good_end:  # a torn line (an append cut by a kill): whole records only
            f.truncate(good_end)
        f.writelines(missing)
        f.flush()
        os.fsync(f.fileno())
    return len(missing)
