"""Keep a chat's conversation in the conversation database as it changes.

After each change (a reply, /retry, /undo, /system, /load, an overflow drop) `sync` makes
the stored conversation match the one in memory: it deletes the stored messages that are no
longer there and appends the new ones, in one transaction. Messages dropped only to fit the
context stay stored (the log keeps the whole conversation).

When the database cannot be used (a damaged file, a full disk, a lock held for too long), the
conversation is not lost: it is written as a JSON transcript (what /save writes, what --load
and /load read) after every change instead, and one line says where.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from .conversation import Conversation
from .store import Store, StoreError, Stored
from .turn_kv import KEEP
from ..results import Result


class Autosave:
    def __init__(self, store: Store | None, *, meta: Callable[[], dict], notice: Callable[[str], None],
                 fallback_dir: Path, broken: str | None = None):
        """`meta()` gives the new conversation row's model, template, settings. With `store`
        None (it could not be opened: `broken` says why, already shown), JSON from the start."""
        self.store = store
        self.meta = meta
        self.notice = notice
        self.fallback_dir = fallback_dir
        self.conversation_id: int | None = None
        self._rows: list[tuple[int, str, str]] = []  # (id, role, content) as stored, in order
        self._kv: dict[int, str] = {}  # row id -> the disk prefix store entry it names (turn_kv)
        self._system: str | None = None
        self._fallback: Path | None = None
        if store is None:
            self._use_json(broken or "the conversation database is not usable")

    @property
    def where(self) -> str:
        """Where the conversation goes, for people: `conversation 12` or a JSON file."""
        if self._fallback is not None:
            return str(self._fallback)
        return f"conversation {self.conversation_id}" if self.conversation_id is not None else "a new conversation"

    def attach(self, stored: Stored) -> None:
        """Go on with a stored conversation (--continue, --resume)."""
        self.conversation_id = stored.id
        self._rows = [(i, m["role"], m["content"]) for i, m in zip(stored.row_ids, stored.messages)]
        self._kv = {i: e for i, e in zip(stored.row_ids, stored.kv_entries) if e}
        self._system = stored.system

    def start_over(self) -> None:
        """The next change goes into a new conversation (/clear, /load)."""
        self.conversation_id = None
        self._rows = []
        self._kv = {}
        self._system = None
        if self._fallback is not None:
            self._fallback = self._new_fallback_path()

    @property
    def keeps_kv(self) -> bool:
        """Whether rows can name the disk prefix store entries of their turns (not in a JSON file)."""
        return self._fallback is None

    def sync(self, conversation: Conversation, result: Result | None = None, kv: dict | None = None) -> list[str]:
        """Store what changed. `result` is the reply that is the conversation's last message;
        `kv` its row's kv_entry and kv_resume (turn_kv). Returns the disk prefix store entries
        no row names any more (the caller deletes them)."""
        if self._fallback is not None:
            self._write_json(conversation)
            return []
        try:
            return self._sync(conversation, result, kv)
        except StoreError as exc:
            self._use_json(str(exc))
            self._write_json(conversation)
            return []

    # -- internals ---------------------------------------------------------------------------

    def _sync(self, conversation: Conversation, result: Result | None, kv: dict | None) -> list[str]:
        assert self.store is not None
        messages = conversation.messages
        stored = self._rows[conversation.dropped:]
        same = 0
        while same < min(len(stored), len(messages)) and stored[same][1:] == (messages[same]["role"],
                                                                                messages[same]["content"]):
            same += 1
        delete = [row[0] for row in stored[same:]]
        add = [dict(m) for m in messages[same:]]
        if self.conversation_id is None:
            if not messages:
                return []  # nothing said yet: no row
            self.conversation_id = self.store.new_conversation(**self.meta(), system=conversation.system)
            self._system = conversation.system
        if not delete and not add and conversation.system == self._system:
            return []
        if add and result is not None and add[-1]["role"] == "assistant":
            usage, timings = result.usage, result.timings
            add[-1].update(tokens=usage.completion_tokens, prompt_tokens=usage.prompt_tokens,
                           cached_tokens=usage.cached_tokens,
                           timings={"prompt_ms": round(timings.prompt_ms, 3), "decode_ms": round(timings.decode_ms, 3)})
            if kv and kv.get("kv_entry"):
                add[-1].update(kv)
        system = conversation.system if conversation.system != self._system else ...
        ids = self.store.change(self.conversation_id, delete=delete, add=add, system=system)
        keep = self._rows[:conversation.dropped + same]
        self._rows = keep + [(i, m["role"], m["content"]) for i, m in zip(ids, add)]
        self._system = conversation.system
        gone = [self._kv.pop(i) for i in delete if i in self._kv]
        self._kv.update({i: m["kv_entry"] for i, m in zip(ids, add) if m.get("kv_entry")})
        if not gone and not any(m.get("kv_entry") for m in add):
            return []
        released = self.store.release_kv(self.conversation_id, KEEP, gone)
        kept = sorted(self._kv)[-KEEP:]
        self._kv = {i: self._kv[i] for i in kept}
        return released

    def _use_json(self, reason: str) -> None:
        self._fallback = self._new_fallback_path()
        self.notice(f"autosave: {reason}; this conversation goes to {self._fallback} instead "
                    f"(--load FILE continues it)")

    def _new_fallback_path(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = self.fallback_dir / f"conversation-{stamp}.json"
        n = 1
        while path.exists():
            n += 1
            path = self.fallback_dir / f"conversation-{stamp}-{n}.json"
        return path

    def _write_json(self, conversation: Conversation) -> None:
        if self._fallback is None or not conversation.full():
            return
        try:
            self._fallback.parent.mkdir(parents=True, exist_ok=True)
            conversation.save(str(self._fallback), **self.meta())
        except OSError as exc:
            self.notice(f"autosave: cannot write {self._fallback}: {exc.strerror or exc}; /save FILE keeps it")


def summary_meta(engine: Any, params: Any) -> dict:
    """The conversation row's model, template and settings for a chat on `engine`."""
    settings = {k: v for k, v in params.to_dict().items() if v is not None} if hasattr(params, "to_dict") else {}
    return {"model": engine.model_name, "template": engine.chat_template.name, "settings": settings}
