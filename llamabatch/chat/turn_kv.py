"""A chat's turns in the engine's disk prefix store (docs/prefix-store.md).

Each reply's request carries SamplingParams.store_prefix: its prompt (the history rendered
up to the new user message) is saved as an entry once evaluated, and the saved conversation
row of the reply names that entry (messages.kv_entry). Every later prompt of the conversation
starts with it, so `chat -c` / `--resume ID` restores it instead of evaluating the history.

Resuming needs exactly the tokens the entry holds (a restored entry is continued only from its
end): the builder is given them, read from the entry's header, and the reply's generated tokens
kept in the row (messages.kv_resume), so the next prompt is the one the live chat would have
sent. The row also keeps the sha256 of the prompt text the entry was made from: when the
conversation renders differently now (another system prompt, exchanges dropped to fit), the
entry is not used and the history is evaluated as before.

Bounded: a conversation keeps the entries of its KEEP newest replies and deletes the others'
files (unless another conversation's row names the same entry: two chats opening alike).
"""
from __future__ import annotations

import hashlib
import logging
from typing import Any, Iterable

# The newest reply's entry (what -c continues from) and the one before it (after an /undo the
# next prompt starts with that reply's prompt).
KEEP = 2

log = logging.getLogger("llamabatch.chat")


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class TurnKV:
    """What the chat asks of the engine's disk prefix store; inert when the engine has none
    (--prefix-store off, a remote or supervised engine, deterministic mode)."""

    def __init__(self, store: Any = None, min_tokens: int = 0):
        self.store = store  # a prefix_store.PrefixStore, or None
        self.min_tokens = min_tokens  # shorter prompts are not worth a file (the engine would not restore them)
        self._said: set[str] = set()

    @classmethod
    def for_engine(cls, engine: Any) -> "TurnKV":
        disk = engine.disk  # None: no store, or the engine runs in another process
        return cls() if disk is None else cls(disk.store, disk.save_min)

    @property
    def enabled(self) -> bool:
        return self.store is not None

    def wanted(self, prompt_tokens: list[int]) -> bool:
        """Whether this prompt's KV is worth saving with the turn."""
        return self.enabled and len(prompt_tokens) > self.min_tokens

    def tokens_of(self, entry: str) -> list[int] | None:
        """The entry's tokens; None when it cannot be resumed from, said once in the log when the
        reason is that it was saved with other KV cache types (`chat -c` after --cache-type-k)."""
        if not self.enabled:
            return None
        tokens = self.store.tokens_of(entry)
        if tokens is None:
            why = self.store.why_not_loaded(entry)
            if why and why not in self._said:
                self._said.add(why)
                log.warning("chat: %s", why)
        return tokens

    def remove(self, entries: Iterable[str]) -> None:
        if self.enabled:
            for entry in entries:
                self.store.remove(entry)
