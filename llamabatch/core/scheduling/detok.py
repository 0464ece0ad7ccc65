"""Incremental detokenization: token byte pieces in, safe-to-show text deltas out.

Two things can make freshly generated text unsafe to emit yet:

* UTF-8: a token's piece may end in the middle of a multi-byte character. The
  incremental decoder holds those bytes until the character completes. Bytes that can
  never start or continue a valid character become U+FFFD at once, so one bad byte
  never stalls the stream.
* Stop strings: the tail of the text might be the start of a stop string that the next
  token completes. We hold back the longest such tail so a stop split across tokens
  never leaks to the caller. Each stop has a small matcher (Knuth-Morris-Pratt) that
  follows the text one character at a time, so the cost per token is linear in its
  length and memory linear in the stops' length (keeping every prefix of every stop, as
  this once did, was quadratic: a 100k-character stop took 17 s and 3.6 GB).

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
        self._matchers = [_StopMatcher(s) for s in self._stops]
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

    def push_text(self, text: str) -> str:
        """Feed text already decoded (a thinking answer's content, its stop strings watched apart
        from its reasoning); return the text that is now safe to emit (maybe "")."""
        if self._finished or self.stopped:
            return ""
        return self._advance(text, final=False)

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
        match_at, stop = self._earliest_stop(pending, new_text)
        if stop is not None:
            self.stopped = True
            self.stop_hit = stop
            self._held = ""
            return self._emit(pending[:match_at])
        # Each matcher's state is the longest tail of the text that is a proper prefix of its stop.
        keep = 0 if final else min(len(pending), max((m.state for m in self._matchers), default=0))
        self._held = pending[len(pending) - keep:] if keep else ""
        return self._emit(pending[: len(pending) - keep])

    def _earliest_stop(self, pending: str, new_text: str) -> tuple[int, str | None]:
        """Feed the new text to every matcher. Of the stops completed in it, the one starting
        earliest in `pending` (at one position, the longest)."""
        best_at, best = len(pending), None
        offset = len(pending) - len(new_text)  # where new_text starts in pending
        for matcher in self._matchers:
            for end in matcher.feed(new_text):
                at = offset + end - len(matcher.stop)
                if at < best_at or (at == best_at and best is not None and len(matcher.stop) > len(best)):
                    best_at, best = at, matcher.stop
        return best_at, best

    def _emit(self, delta: str) -> str:
        if delta:
            self._parts.append(delta)
        return delta


class _StopMatcher:
    """Knuth-Morris-Pratt over a stream: `state` is how many characters of `stop` the text's
    tail matches; each character costs O(1) amortized, whatever the stop's length."""

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.state = 0
        # fail[i]: length of the longest proper prefix of stop[:i + 1] that is also its suffix
        fail = [0] * len(stop)
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = fail[k - 1]
            if stop[i] == stop[k]:
                k += 1
            fail[i] = k
        self._fail = fail

    def feed(self, text: str) -> list[int]:
        """Advance over `text`; return the end offsets (exclusive, in `text`) of every match."""
        stop, fail, k, n = self.stop, self._fail, self.state, len(self.stop)
        ends = []
        if len(text) == 1 and not k and text != stop[0]:
            return ends  # the common case: one character that starts nothing
        for i, ch in enumerate(text):
            while k and ch != stop[k]:
                k = fail[k - 1]
            if ch == stop[k]:
                k += 1
            if k == n:
                ends.append(i + 1)
                k = fail[k - 1]
        self.state = k
        return ends
