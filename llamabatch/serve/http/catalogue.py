"""The SQLite catalogue of files and batches in the data dir (catalogue.sqlite3).

One connection shared by the server's threads behind a lock (calls take microseconds); WAL
journal and synchronous=FULL, so a row written before a kill -9 is there after it. Rows list
newest first, as OpenAI lists them; `after` is an id, and the page holds the objects older
than it. The order is the insertion sequence, not the clock (two in one second keep theirs).
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from typing import Any

from .batches.records import STATUS_TIMES, BatchRecord, FileRecord, dumps, loads

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, filename TEXT NOT NULL,
    purpose TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, path TEXT NOT NULL,
    lines INTEGER NOT NULL DEFAULT 0, urls TEXT NOT NULL DEFAULT '[]');
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, input_file_id TEXT NOT NULL,
    endpoint TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, metadata TEXT,
    total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    output_file_id TEXT, error_file_id TEXT, errors TEXT, times TEXT NOT NULL DEFAULT '{}');
"""
_FILE_COLUMNS = "id, filename, purpose, bytes, created_at, path, lines, urls"
_BATCH_COLUMNS = ("id, input_file_id, endpoint, completion_window, status, created_at, expires_at, metadata, "
                  "total, completed, failed, output_file_id, error_file_id, errors, times")
_UPDATABLE = {"status", "total", "completed", "failed", "output_file_id", "error_file_id", "errors"}


class Catalogue:
    def __init__(self, path: str):
        _owner_only(path)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # -- files ----------------------------------------------------------------------------

    def add_file(self, f: FileRecord) -> None:
        self._query(f"INSERT INTO files ({_FILE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                    (f.id, f.filename, f.purpose, f.bytes, f.created_at, f.path, f.lines, dumps(f.urls)))

    def file(self, file_id: str) -> FileRecord | None:
        rows = self._query(f"SELECT {_FILE_COLUMNS} FROM files WHERE id = ?", (file_id,))
        return _file(rows[0]) if rows else None

    def files(self, *, after: str | None, limit: int, ascending: bool, purpose: str | None) -> tuple[list[FileRecord], bool]:
        """A page of files (and whether more follow it)."""
        where, args = _page("files", after, ascending)
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        rows = self._query(f"SELECT {_FILE_COLUMNS} FROM files {_where(where)} ORDER BY seq "
                           f"{'ASC' if ascending else 'DESC'} LIMIT ?", (*args, limit + 1))
        return [_file(r) for r in rows[:limit]], len(rows) > limit

    def delete_file(self, file_id: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount > 0

    # -- batches --------------------------------------------------------------------------

    def add_batch(self, b: BatchRecord) -> None:
        self._query(f"INSERT INTO batches ({_BATCH_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (b.id, b.input_file_id, b.endpoint, b.completion_window, b.status, b.created_at,
                     b.expires_at, dumps(b.metadata), b.total, b.completed, b.failed, b.output_file_id,
                     b.error_file_id, dumps(b.errors), dumps(b.times)))

    def batch(self, batch_id: str) -> BatchRecord | None:
        rows = self._query(f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id = ?", (batch_id,))
        return _batch(rows[0]) if rows else None

    def batches(self, *, after: str | None, limit: int) -> tuple[list[BatchRecord], bool]:
        where, args = _page("batches", after, False)
        rows = self._query(f"SELECT {_BATCH_COLUMNS} FROM batches {_where(where)} ORDER BY seq DESC LIMIT ?",
                           (*args, limit + 1))
        return [_batch(r) for r in rows[:limit]], len(rows) > limit

    def batches_in(self, statuses: tuple[str, ...]) -> list[BatchRecord]:
        """Batches in any of `statuses`, oldest first (the queue's order)."""
        marks = ",".join("?" * len(statuses))
        rows = self._query(f"SELECT {_BATCH_COLUMNS} FROM batches WHERE status IN ({marks}) ORDER BY seq", statuses)
        return [_batch(r) for r in rows]

    def batches_reading(self, file_id: str, statuses: tuple[str, ...]) -> list[str]:
        marks = ",".join("?" * len(statuses))
        rows = self._query(f"SELECT id FROM batches WHERE input_file_id = ? AND status IN ({marks})",
                           (file_id, *statuses))
        return [r[0] for r in rows]

    def update_batch(self, batch_id: str, now: int | None = None, **fields: Any) -> None:
        """Set `fields`; a new `status` also sets its timestamp (OpenAI's in_progress_at, ...) to `now`."""
        bad = set(fields) - _UPDATABLE
        if bad:
            raise ValueError(f"not a batch column: {sorted(bad)}")
        with self._lock:
            sets = [f"{k} = ?" for k in fields]
            args = [dumps(v) if k == "errors" else v for k, v in fields.items()]
            if "status" in fields and fields["status"] in STATUS_TIMES and now is not None:
                sets.append("times = json_set(times, ?, ?)")
                args += [f"$.{STATUS_TIMES[fields['status']]}", now]
            self._db.execute(f"UPDATE batches SET {', '.join(sets)} WHERE id = ?", (*args, batch_id))


def _owner_only(path: str) -> None:
    """Make the database file (or keep it) readable by its owner alone, whatever the data dir's
    mode and the umask: it names every file and holds every batch's metadata. SQLite creates
    its -wal and -shm files with the database file's mode; those an older server left are fixed."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for journal in (f"{path}-wal", f"{path}-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(journal, 0o600)


def _page(table: str, after: str | None, ascending: bool) -> tuple[list[str], list[Any]]:
    if after is None:
        return [], []
    # an unknown `after` gives an empty page (nothing is "after" an object that is not there)
    return [f"seq {'>' if ascending else '<'} COALESCE((SELECT seq FROM {table} WHERE id = ?), "
            f"{'1e18' if ascending else '-1'})"], [after]


def _where(parts: list[str]) -> str:
    return f"WHERE {' AND '.join(parts)}" if parts else ""


def _file(row: tuple) -> FileRecord:
    return FileRecord(*row[:7], urls=loads(row[7]) or [])


def _batch(row: tuple) -> BatchRecord:
    (id_, input_file_id, endpoint, window, status, created_at, expires_at, metadata, total, completed, failed,
     output_file_id, error_file_id, errors, times) = row
    return BatchRecord(id_, input_file_id, endpoint, window, status, created_at, expires_at, loads(metadata),
                       total, completed, failed, output_file_id, error_file_id, loads(errors), loads(times) or {})
