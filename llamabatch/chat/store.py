"""The chat's conversation log: a SQLite database under the XDG state dir.

    $XDG_STATE_HOME/llamabatch/conversations.db   (default ~/.local/state/...)

The design is simonw/llm's `logs.db`: one row per conversation, one per message, a
full-text index over the messages, a schema version (`PRAGMA user_version`) and a list of
migrations applied in order from day one. WAL mode and a busy timeout let two chats write at
once; every change is one short transaction, so neither loses the other's turns.

A file that is not a SQLite database, a damaged one, or one written by a newer llamabatch
raises StoreError (one line) and is never written to: the header is checked before SQLite
opens the file, and the schema version before any migration runs.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from ..errors import LlamaBatchError
from ..files.json_line import BadJSON, loads

SQLITE_HEADER = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 30.0  # another chat's transaction takes milliseconds; wait rather than fail

# Migration N brings the schema from version N to N + 1. Append; never edit a released one.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started REAL NOT NULL,          -- unix time
        updated REAL NOT NULL,          -- last message; what --continue picks by
        model TEXT,
        template TEXT,
        settings TEXT,                  -- JSON: the sampling settings at the start
        system TEXT
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        tokens INTEGER,                 -- a reply's generated tokens
        prompt_tokens INTEGER,          -- a reply's whole prompt ...
        cached_tokens INTEGER,          -- ... and the part the prefix cache served
        timings TEXT,                   -- JSON: prompt_ms, decode_ms
        time REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages', content_rowid='id');
    CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END;
    CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    END;
    """,
    # 1 -> 2: the disk prefix store entry holding the KV of the prompt a reply answered, and
    # what --continue needs to go on from it (JSON: the prompt text's sha256 and the reply's
    # tokens). Only a conversation's latest turns keep one (see Store.release_kv).
    """
    ALTER TABLE messages ADD COLUMN kv_entry TEXT;
    ALTER TABLE messages ADD COLUMN kv_resume TEXT;
    CREATE INDEX messages_by_kv_entry ON messages(kv_entry) WHERE kv_entry IS NOT NULL;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


class StoreError(LlamaBatchError):
    """The conversation database cannot be used; the message is one line naming the file."""

    code = "store_error"


def default_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "llamabatch" / "conversations.db"


@dataclass
class Summary:
    """One conversation as --list and --search show it."""

    id: int
    started: float
    updated: float
    model: str
    messages: int
    first_line: str  # the first user message's first line (--search: the matching text)


@dataclass
class Stored:
    """A conversation read back for --continue / --resume."""

    id: int
    model: str
    template: str
    system: str | None
    messages: list[dict]  # {"role", "content"}
    row_ids: list[int]  # the messages' ids, in the same order
    # per message, in the same order: the disk prefix store entry of the prompt a reply
    # answered and its resume data (kv_resume JSON), or None
    kv_entries: list[str | None] = field(default_factory=list)
    kv_resume: list[dict | None] = field(default_factory=list)


class Store:
    def __init__(self, path: Path | str | None = None, *, create: bool = True):
        self.path = Path(path) if path is not None else default_path()
        self._check_header()
        if not create and not self.path.exists():
            self.db = None
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db: sqlite3.Connection | None = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S,
                                                                 isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open {self.path}: {_reason(exc)}") from None
        try:
            self._migrate()
        except BaseException:
            self.close()
            raise

    # -- opening ----------------------------------------------------------------------------

    def _check_header(self) -> None:
        # SQLite itself would write to some damaged files (a journal, a WAL) before failing.
        try:
            with open(self.path, "rb") as f:
                head = f.read(len(SQLITE_HEADER))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if head and head != SQLITE_HEADER:  # (an empty file is a new database to SQLite)
            raise StoreError(f"{self.path} is not a SQLite database (left as it is; move it away to start "
                             f"a new one, or use --no-save)")

    def _migrate(self) -> None:
        db = self._db()
        with self._errors("read"):
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(f"{self.path} was written by a newer llamabatch (schema {version}; this one reads "
                                 f"up to {SCHEMA_VERSION}); left as it is")
            _when_unlocked(lambda: db.execute("PRAGMA journal_mode=WAL"))
            db.execute("PRAGMA foreign_keys=ON")
        if version == SCHEMA_VERSION:
            return
        with self._transaction() as db:  # two chats starting at once: one migrates, the other waits
            version = db.execute("PRAGMA user_version").fetchone()[0]
            for n in range(version, SCHEMA_VERSION):
                for statement in _statements(MIGRATIONS[n]):
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    # -- writing ----------------------------------------------------------------------------

    def new_conversation(self, *, model: str, template: str, settings: dict, system: str | None) -> int:
        now = time.time()
        with self._transaction() as db:
            cur = db.execute("INSERT INTO conversations (started, updated, model, template, settings, system) "
                             "VALUES (?, ?, ?, ?, ?, ?)", (now, now, model, template, json.dumps(settings), system))
            return int(cur.lastrowid)

    def change(self, conversation_id: int, *, delete: Iterable[int] = (), add: Iterable[dict] = (),
               system: Any = ...) -> list[int]:
        """In one transaction: delete messages by id, append messages, set the system prompt
        (when given). Returns the new messages' ids."""
        now = time.time()
        ids = []
        with self._transaction() as db:
            for row_id in delete:
                db.execute("DELETE FROM messages WHERE id = ? AND conversation_id = ?", (row_id, conversation_id))
            for m in add:
                cur = db.execute(
                    "INSERT INTO messages (conversation_id, role, content, tokens, prompt_tokens, cached_tokens, "
                    "timings, time, kv_entry, kv_resume) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (conversation_id, m["role"], m["content"], m.get("tokens"), m.get("prompt_tokens"),
                     m.get("cached_tokens"), json.dumps(m["timings"]) if m.get("timings") else None, now,
                     m.get("kv_entry"), json.dumps(m["kv_resume"]) if m.get("kv_resume") else None))
                ids.append(int(cur.lastrowid))
            if system is not ...:
                db.execute("UPDATE conversations SET system = ? WHERE id = ?", (system, conversation_id))
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        return ids

    # -- reading ----------------------------------------------------------------------------

    def latest_id(self) -> int | None:
        if self.db is None:
            return None
        with self._errors("read"):
            row = self.db.execute("SELECT id FROM conversations ORDER BY updated DESC, id DESC LIMIT 1").fetchone()
        return row[0] if row else None

    def read(self, conversation_id: int) -> Stored | None:
        if self.db is None:
            return None
        with self._errors("read"):
            head = self.db.execute("SELECT id, model, template, system FROM conversations WHERE id = ?",
                                   (conversation_id,)).fetchone()
            if head is None:
                return None
            rows = self.db.execute("SELECT id, role, content, kv_entry, kv_resume FROM messages "
                                   "WHERE conversation_id = ? ORDER BY id", (conversation_id,)).fetchall()
        return Stored(head[0], head[1] or "", head[2] or "", head[3],
                      [{"role": r[1], "content": r[2]} for r in rows], [r[0] for r in rows],
                      [r[3] for r in rows], [_json_or_none(r[4]) for r in rows])

    def release_kv(self, conversation_id: int, keep: int, gone: Iterable[str] = ()) -> list[str]:
        """Bound the prefix store entries a conversation holds: its `keep` newest rows with an
        entry keep it, older rows forget theirs. Returns the entries no row (of any
        conversation) names any more, among those forgotten and `gone` (the entries of rows
        just deleted): the caller deletes those files."""
        with self._transaction() as db:
            rows = db.execute("SELECT id, kv_entry FROM messages WHERE conversation_id = ? AND kv_entry IS NOT NULL "
                              "ORDER BY id DESC", (conversation_id,)).fetchall()
            old = rows[keep:]
            for row_id, _ in old:
                db.execute("UPDATE messages SET kv_entry = NULL, kv_resume = NULL WHERE id = ?", (row_id,))
            candidates = dict.fromkeys([entry for _, entry in old] + [e for e in gone if e])
            return [e for e in candidates
                    if db.execute("SELECT 1 FROM messages WHERE kv_entry = ? LIMIT 1", (e,)).fetchone() is None]

    def list(self, limit: int | None = None) -> list[Summary]:
        if self.db is None:
            return []
        with self._errors("read"):
            rows = self.db.execute(
                "SELECT c.id, c.started, c.updated, c.model, "
                " (SELECT count(*) FROM messages m WHERE m.conversation_id = c.id), "
                " (SELECT content FROM messages m WHERE m.conversation_id = c.id AND m.role = 'user' ORDER BY m.id LIMIT 1) "
                "FROM conversations c ORDER BY c.updated DESC, c.id DESC" + (" LIMIT ?" if limit else ""),
                (limit,) if limit else ()).fetchall()
        return [Summary(r[0], r[1], r[2], r[3] or "", r[4], _first_line(r[5] or "")) for r in rows]

    def search(self, text: str) -> list[Summary]:
        """Conversations with a message matching every word of `text` (FTS5), newest first;
        first_line is the best match's text around the words."""
        query = " ".join('"' + word.replace('"', '""') + '"' for word in text.split())
        if self.db is None or not query:
            return []
        with self._errors("search"):
            rows = self.db.execute(
                "SELECT c.id, c.started, c.updated, c.model, "
                " (SELECT count(*) FROM messages m2 WHERE m2.conversation_id = c.id), "
                " snippet(messages_fts, 0, '', '', '...', 12) "
                "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
                "JOIN conversations c ON c.id = m.conversation_id "
                "WHERE messages_fts MATCH ? ORDER BY c.updated DESC, c.id DESC, rank", (query,)).fetchall()
        seen: dict[int, Summary] = {}
        for r in rows:
            seen.setdefault(r[0], Summary(r[0], r[1], r[2], r[3] or "", r[4], _first_line(r[5] or "")))
        return list(seen.values())

    # -- internals ----------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        if self.db is None:
            raise StoreError(f"{self.path} is closed")
        return self.db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._errors("write"):
            db = self._db()
            db.execute("BEGIN IMMEDIATE")  # takes the write lock now: waits (busy timeout) for another chat's turn
            try:
                yield db
            except BaseException:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # SQLite rolled back already
                raise
            db.execute("COMMIT")

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"cannot {doing} {self.path}: {_reason(exc)}") from None


def _when_unlocked(step, timeout_s: float = BUSY_TIMEOUT_S):
    """Run `step`, retrying while another connection holds the lock. Switching a new database
    to WAL while a second chat opens it at the same moment answers "database is locked" at
    once: SQLite does not call the busy handler for that switch. Seen as one of two chats
    started together losing its log (1 in 4 starts in a 200-start stress run)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            return step()
        except sqlite3.OperationalError as exc:
            text = str(exc)
            if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _statements(script: str) -> list[str]:
    # executescript() would COMMIT the surrounding transaction; run statements one by one
    out, current = [], ""
    for line in script.strip().splitlines():
        current += line + "\n"
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    return out


def _json_or_none(text: str | None) -> Any:
    if not text:
        return None
    try:
        return loads(text)
    except BadJSON:  # written by hand, or damaged (too deep, a huge number...): resume without it
        return None


def _first_line(text: str) -> str:
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= 72 else line[:71] + "…"


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
