"""Prefix affinity for `serve --ray`'s online requests: a prompt that begins like one a worker
ran recently goes to that worker, whose engine may still hold that beginning in a slot's KV
cache (a chat's next turn resends every earlier turn), unless that worker is busy.

Cheap on the driver and plain Python (no ray import): the prompt as text (kv_layout.prompt_text,
which `run`'s layout choice compares too: a chat's or token ids' JSON, so a turn's text begins
the next turn's) is hashed block by block, each block's hash covering every block before it, so
a hash names a whole prefix; the hashes of the first MAX_BLOCKS blocks map
to the worker that last ran a prompt with that prefix, in a bounded LRU table. The longest
known prefix wins. The rule that may override it is the dispatcher's (dispatch.py).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

from ..settings.kv_layout import prompt_text

BLOCK_BYTES = 64  # about 16 tokens of text: a prefix shorter than one block is not worth a queue
MAX_BLOCKS = 256  # prefixes up to 16 KB are told apart; a longer prompt's first 16 KB count
MAX_ENTRIES = 65_536  # prefix hashes remembered (8-byte keys): a few MB at most


def prefix_keys(prompt: Any) -> list[bytes]:
    """One hash per whole block of the prompt's text (up to MAX_BLOCKS), the i-th covering
    blocks 0..i: the names of the prompt's prefixes, shortest first."""
    data = prompt_text(prompt).encode("utf-8", "surrogatepass")
    h = hashlib.blake2b(digest_size=8)
    keys = []
    for end in range(BLOCK_BYTES, min(len(data), BLOCK_BYTES * MAX_BLOCKS) + 1, BLOCK_BYTES):
        h.update(data[end - BLOCK_BYTES:end])
        keys.append(h.digest())
    return keys


class PrefixAffinity:
    """Prefix hash -> the name of the worker that last ran a prompt with that prefix."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = max_entries
        self._where: OrderedDict[bytes, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._where)

    def worker_for(self, keys: list[bytes]) -> str | None:
        """The worker that ran the longest of these prefixes last, or None."""
        for key in reversed(keys):
            name = self._where.get(key)
            if name is not None:
                return name
        return None

    def remember(self, keys: list[bytes], worker: str) -> None:
        """`worker` runs this prompt now: each of its prefixes is there from now on."""
        where = self._where
        for key in keys:
            where[key] = worker
            where.move_to_end(key)
        while len(where) > self.max_entries:
            where.popitem(last=False)
