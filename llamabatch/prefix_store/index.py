"""The in-memory index of one fingerprint folder: which token sequences the entries hold.

Each entry's tokens are kept as one bytes object of big-endian uint32s (4 bytes a token, not a
list of int objects), so that byte order is token order: the sorted list of these keys is in
lexicographic token order. In that order the entry sharing the longest prefix with a query is
always next to the query's insertion point, so a lookup is a binary search plus two prefix
comparisons, whatever the number of entries. Comparisons are slices compared in C (memcmp).
"""
from __future__ import annotations

import bisect
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Sequence

from ..core.prefixes.common_prefix import common_prefix


def sort_key(tokens: Sequence[int]) -> bytes:
    try:
        return struct.pack(f">{len(tokens)}I", *tokens)
    except struct.error as exc:
        raise ValueError(f"token ids must be integers in 0..2**32-1: {exc}") from None


def sort_key_from_le(tokens_le: bytes) -> bytes:
    ids = array("I")
    if ids.itemsize != 4 or sys.byteorder == "big":  # pragma: no cover
        return sort_key(struct.unpack(f"<{len(tokens_le) // 4}I", tokens_le))
    ids.frombytes(tokens_le)
    ids.byteswap()
    return ids.tobytes()


@dataclass(frozen=True)
class Match:
    name: str
    common: int  # tokens shared with the query
    n_tokens: int


class PrefixIndex:
    """Entry names -> token keys, kept sorted. Not thread-safe: the store holds its lock."""

    def __init__(self) -> None:
        self._keys: list[bytes] = []  # sorted
        self._names: list[str] = []  # parallel to _keys
        self._by_name: dict[str, tuple[bytes, int]] = {}  # name -> (key, file bytes)

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def names(self) -> set[str]:
        return set(self._by_name)

    def total_bytes(self) -> int:
        return sum(size for _, size in self._by_name.values())

    def add(self, name: str, key: bytes, file_bytes: int) -> None:
        if name in self._by_name:
            return
        at = bisect.bisect_left(self._keys, key)
        self._keys.insert(at, key)
        self._names.insert(at, name)
        self._by_name[name] = (key, file_bytes)

    def remove(self, name: str) -> None:
        found = self._by_name.pop(name, None)
        if found is None:
            return
        at = bisect.bisect_left(self._keys, found[0])
        while self._names[at] != name:  # equal keys only under a sha256 collision
            at += 1
        del self._keys[at], self._names[at]

    def longest(self, query: bytes, min_common: int = 1) -> Match | None:
        """The entry sharing the most leading tokens with `query` (a sort_key), if >= min_common.

        Among entries sharing the same number of tokens, the one that is exactly that prefix of
        the query is preferred (nothing of it has to be dropped after a restore), then the
        shorter one.
        """
        at = bisect.bisect_left(self._keys, query)
        best: tuple[int, int] | None = None  # (common tokens, -n_tokens), index
        best_at = -1
        for i in (at - 1, at):
            if 0 <= i < len(self._keys):
                key = self._keys[i]
                rank = (common_prefix(key, query) // 4, -len(key))
                if best is None or rank > best:
                    best, best_at = rank, i
        if best is None or best[0] < max(min_common, 1):
            return None
        common = best[0]
        exact = bisect.bisect_left(self._keys, query[: 4 * common])
        if exact < len(self._keys) and self._keys[exact] == query[: 4 * common]:
            best_at = exact
        return Match(self._names[best_at], common, len(self._keys[best_at]) // 4)

    def longest_starting(self, query: bytes, min_tokens: int = 1) -> Match | None:
        """The longest entry whose whole key starts `query` (n_tokens >= min_tokens), for a
        caller that can only continue an entry from its end (the engine's restores).

        The largest key <= q that is not a prefix of q shares `c` tokens with it; no prefix of q
        longer than c can exist (it would sort between that key and q), so the search goes on
        with q cut to c tokens: a few binary searches, whatever the number of entries."""
        floor = 4 * max(min_tokens, 1)
        q = query
        while len(q) >= floor:
            i = bisect.bisect_right(self._keys, q) - 1
            if i < 0:
                return None
            key = self._keys[i]
            if q.startswith(key):  # the largest key <= q that starts q: the longest one
                n = len(key) // 4
                return Match(self._names[i], n, n) if len(key) >= floor else None
            q = q[: common_prefix(key, q) // 4 * 4]
        return None

