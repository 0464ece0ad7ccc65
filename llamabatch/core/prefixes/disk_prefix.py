"""The engine's side of the disk prefix store (llamabatch/prefix_store/): which prompts it
restores, which prefixes it saves, and the rules for both. Never imports llama_cpp.

The store keeps KV bytes by token ids (runner.snapshot writes them, a plan.Restore puts them
back). An entry is only ever continued from its end (plan.Restore says why), so a prompt is
restored from the longest entry whose whole token list starts it, and what gets saved is
exactly the shared part of two prompts (PrefixSaves.mark: the prefill is cut there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

# A prefix shorter than this is not worth a file: evaluating it takes about as long as
# reading it back (Gemma 3 270M: ~16 KB of KV per token).
SAVE_MIN_TOKENS = 128
# Restore only when the entry brings at least this many tokens more than the slot's own cache.
RESTORE_MIN_GAIN = 32


@dataclass(frozen=True)
class DiskHit:
    name: str  # the entry's name in the store
    tokens: list[int]  # the entry's tokens: a prefix of the prompt
    payload: Any  # the KV bytes, checked


class DiskPrefixes:
    """What the scheduler and the engine ask of the store (a prefix_store.PrefixStore:
    longest_starting, load, holds, save, close)."""

    def __init__(self, store: Any, *, save_min: int = SAVE_MIN_TOKENS, restore_min_gain: int = RESTORE_MIN_GAIN):
        self.store = store
        self.save_min = save_min
        self.restore_min_gain = restore_min_gain

    def lookup(self, prompt: Sequence[int], *, longer_than: int) -> DiskHit | None:
        """The longest entry whose whole token list starts `prompt` (leaving its last token to
        evaluate: its logits give the first sampled token) and beats what the slot already
        holds by RESTORE_MIN_GAIN; its KV read and checked. None: nothing usable."""
        head = list(prompt[: len(prompt) - 1])
        at_least = max(self.save_min, longer_than + self.restore_min_gain)
        if len(head) < at_least:
            return None
        hit = self.store.longest_starting(head, at_least)
        if hit is None:
            return None
        # load checks the file's tokens against its name (a hash of them), which the index
        # matched against the prompt: they start it
        loaded = self.store.load(hit)
        if loaded is None:  # torn, foreign or gone meanwhile: the store removed it and logged why
            return None
        tokens, payload = loaded
        return DiskHit(hit.name, tokens, payload)

    def has(self, tokens: Sequence[int]) -> bool:
        """Whether an entry of exactly these tokens exists (or is being written)."""
        return self.store.holds(tokens)

    def save(self, tokens: list[int], payload: Any) -> str | None:
        """Queue the write (the payload is handed over: a fresh snapshot nobody else holds)."""
        return self.store.save(tokens, payload, owned=True)

    def close(self, timeout: float = 5.0) -> None:
        """Let queued writes finish, at most `timeout` seconds (a write cut short leaves only a
        temporary file, never a loadable entry)."""
        self.store.close(timeout)
