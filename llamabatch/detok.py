"""Incremental detokenization: token byte pieces in, safe-to-show text deltas out.

Two things can make freshly generated text unsafe to emit yet:

* UTF-8: a token's piece may end in the middle of a multi-byte character. The
  incremental decoder holds those bytes until the character completes. Bytes that can
  never start or continue a valid character become U+FFFD at once, so one bad byte
  never stalls the stream.
* Stop strings: the tail of the text might be the start of a stop string that the next
  token completes. We hold back the longest such tail so a stop split across tokens
  never leaks to the caller.

Invariant: the concatenation of every delta returned by `push` and `finish` equals
`text`, and `text` never contains a stop string or anything after it.
"""
from __future__ import annotations

import codecs
from typing import Sequence


class IncrementalDetokenizer:
    """Turn one sequence's stream of token pieces into text deltas, honouring stop strings."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        if isinstance(stop, str):  # a lone string would otherwise become one stop per char
            stop = (stop,)
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(stop))  # dedupe, keep order
        # Every proper prefix of every stop: a pending tail equal to one of these may
        # still grow into a stop, so it is held back.
        self._stop_prefixes: frozenset[str] = frozenset(
            s[:k] for s in self._stops for k in range(1, len(s))
        )
        self._longest_prefix = max((len(s) - 1 for s in self._stops), default=0)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # decoded text not yet emitted (always shorter than the longest stop)
        self._parts: list[str] = []  # emitted deltas; joined lazily by `text`
        self._finished = False
        self.stopped = False
        self.stop_hit: str | None = None

    @property
    def text(self) -> str:
        """Everything emitted so far (the concatenation of all returned deltas)."""
        # Joined on demand and cached as one part: `self.x += delta` on an attribute
        # would copy the whole string per token.
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def push(self, piece: bytes) -> str:
        """Feed one token's bytes; return the text that is now safe to emit (maybe "")."""
        if self._finished:
            raise RuntimeError("push() after finish()")
        if self.stopped:
            return ""
        return self._advance(self._decoder.decode(piece), final=False)

    def finish(self) -> str:
        """End of generation: release everything held back.

        An incomplete UTF-8 sequence at the very end decodes as U+FFFD. After a stop
        match, or on a second call, this returns "".
        """
        if self._finished or self.stopped:
            self._finished = True
            return ""
        self._finished = True
        return self._advance(self._decoder.decode(b"", final=True), final=True)

    def _advance(self, new_text: str, final: bool) -> str:
        # Only the held tail plus the new text can contain a stop: anything emitted
        # earlier had no stop prefix at its end, or it would have been held.
        pending = self._held + new_text
        if not pending:
            return ""
        match_at, stop = self._earliest_stop(pending)
        if stop is not None:
            self.stopped = True
            self.stop_hit = stop
            self._held = ""
            return self._emit(pending[:match_at])
        keep = 0 if final else self._held_tail_len(pending)
        self._held = pending[len(pending) - keep:] if keep else ""
        return self._emit(pending[: len(pending) - keep])

    def _earliest_stop(self, pending: str) -> tuple[int, str | None]:
        """Position and stop string of the earliest match; at one position, the longest."""
        best_at, best = len(pending), None
        for stop in self._stops:
            at = pending.find(stop, 0, best_at + len(stop))  # only matches at or before best_at
            if at != -1 and (at < best_at or (at == best_at and best is not None and len(stop) > len(best))):
                best_at, best = at, stop
        return best_at, best

    def _held_tail_len(self, pending: str) -> int:
        """Length of the longest suffix of `pending` that is a proper prefix of some stop."""
        for k in range(min(len(pending), self._longest_prefix), 0, -1):
            if pending[-k:] in self._stop_prefixes:
                return k
        return 0

    def _emit(self, delta: str) -> str:
        if delta:
            self._parts.append(delta)
        return delta
