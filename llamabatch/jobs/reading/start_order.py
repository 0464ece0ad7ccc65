"""Which read line `run` starts next: prefix-aware ordering in a bounded read-ahead window.

The engine evaluates a prompt prefix once while some slot holds it: a slot that ran a line
keeps its KV, and a line sharing a prefix with a busy slot gets it by a KV fork
(core/scheduling/scheduler.py). Lines of more instructions than slots, interleaved line by line, never
find theirs: each slot is reused for another instruction before the next line of its own
comes, and every line evaluates its instruction again. So `run` reads up to `window` lines
ahead and chooses which to start.

The rule, per start: the oldest waiting line that is "hot" — it finds in the slots all it
shares with other lines: a prefix of at least MIN_SHARED that one of the last `recent`
started lines holds (`recent` = the engine's slots: what was started last is what the slots
hold when its turn comes), and no longer prefix it shares with a line met in the window
(or started) that the slots do not hold — else the oldest line. The first `recent` lines
start in read order, so the slots begin as varied as INPUT is. Why this one:
  - with fewer slots than instructions, the lines of the instructions the slots hold go
    first, so those stay cached; a line of another instruction waits until none is left
    in the window (then it starts the next group) or until it has been overtaken
    `window` times (fake engine, 96 lines: ~3x fewer prompt tokens evaluated than read
    order with 2 slots and 4 instructions, and with 4 slots and 8);
  - with as many slots as instructions or more, every line is hot and this is read order,
    which is what the slots' caches serve best; rules that rank by the longest cached
    prefix, or by the prefix shared with the last line started, made runs of one (the
    longest) instruction there that pushed the others out of the slots: 1.6x the prompt
    tokens of read order on the model with 8 slots and 4 instructions;
  - "all it shares", not "the longest cached prefix": a line whose own few-shot block is
    not cached waits for the lines whose block is, even when every line shares a cached
    system prompt; two lines of one instruction are equally hot however their own texts
    begin;
  - oldest first among the hot: read order keeps `--order input`'s reorder buffer short
    and nobody waiting long.
Starvation is bounded: a line is overtaken by at most `window` lines read after it; when
the oldest waiting line has been, it starts next whatever it shares.

Prompts are compared as text (a chat's messages as role + content, in order), not token
ids: the rendered prompt and its tokens follow the messages, and text costs no tokenizer
round trip (the engine may be a child process or a Ray pool). Embeddings lines hold no
prefix and take none from the slots: always hot. Pure: no threads, no engine.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from ...core.prefixes.common_prefix import common_prefix
from ...core.inputs import is_chat

# A shared prefix shorter than this (characters; token ids for a token-id prompt) is not
# worth reordering for: ~16 tokens of text, less than one prefill chunk saves.
MIN_SHARED = 64


def prompt_key(item: Any) -> str | None:
    """What a line's prompt is compared by: its text, its chat messages as one text, or its
    token ids as characters; None for a line that holds no prefix (embeddings)."""
    if getattr(item, "embed", None) is not None:
        return None
    prompt = getattr(item, "prompt", None)
    if isinstance(prompt, str):
        return prompt
    if is_chat(prompt):
        return "".join(f"\x1e{m.get('role')}\x1f{_content_text(m.get('content'))}" for m in prompt)
    if isinstance(prompt, (list, tuple)) and prompt and all(type(t) is int and 0 <= t < 0x110000 for t in prompt):
        return "\x00" + "".join(map(chr, prompt))  # the marker keeps ids apart from text
    return None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: their text, in order
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


@dataclass
class _Waiting:
    seq: int  # the line's number in read order (the writer's seq)
    item: Any
    key: str | None
    shared: int = 0  # the longest prefix it shares with a line met in the window (or started)
    overtaken: int = 0  # lines read after it that started before it
    last: bool = False  # a long line: it starts only when no other line waits


class StartOrder:
    """The lines read but not started, and the choice of the next one to start.

    `window` is how many lines may wait (the reader fills it; `full` says when to stop
    reading); 0 and 1 both mean read order. `recent`: how many of the last started lines'
    prompts count as cached (the engine's slots)."""

    def __init__(self, window: int, recent: int = 1, min_shared: int = MIN_SHARED,
                 last: Callable[[Any], bool] | None = None):
        self.window = max(1, window)
        # Lines that start last (`run` with n_ctx auto: those longer than a default slot,
        # context_fit.py): one long prompt's prefill rides on every tick it shares with short
        # lines and slows them all; started once only long lines wait (the window is full of
        # them, or INPUT is read) and the short lines in flight have ended (batch_loop.py), it
        # costs the short ones nothing. Never a deadlock: a window holding only such lines
        # starts them.
        self.last = last
        self.min_shared = min_shared
        self._waiting: list[_Waiting] = []  # in read order
        self._sorted: list[tuple[str, int]] = []  # (key, seq) of the waiting lines that have a key, sorted
        self._by_seq: dict[int, _Waiting] = {}
        self._recent: deque[str] = deque(maxlen=max(1, recent))  # keys of the last started lines

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def full(self) -> bool:
        return len(self._waiting) >= self.window

    def add(self, seq: int, item: Any) -> None:
        line = _Waiting(seq, item, prompt_key(item) if self.window > 1 else None,
                        last=bool(self.last is not None and self.last(item)))
        if line.key is not None:
            # The longest prefix a key shares with any key of a set is the one it shares with
            # a neighbour in sorted order: two comparisons, not one per waiting line. A line
            # not next to the new one already shares at least as much with its own neighbour.
            entry = (line.key, seq)
            at = bisect.bisect(self._sorted, entry)
            for other in (self._sorted[at - 1:at] + self._sorted[at:at + 1]):
                n = common_prefix(line.key, other[0])
                neighbour = self._by_seq[other[1]]
                neighbour.shared = max(neighbour.shared, n)
                line.shared = max(line.shared, n)
            line.shared = max(line.shared, self._cached(line.key))
            self._sorted.insert(at, entry)
            self._by_seq[seq] = line
        self._waiting.append(line)

    def take(self) -> tuple[int, Any]:
        """The next line to start, as (seq, item). Raises IndexError when none waits."""
        waiting = self._waiting
        # the lines that may start now: all but the long ones, unless only long ones wait
        ready = [i for i, line in enumerate(waiting) if not line.last] or list(range(len(waiting)))
        chosen = ready[0]
        # Read order until as many lines started as there are slots: the first ones decide
        # what the slots hold, and they should be as varied as INPUT is.
        warm = len(self._recent) == self._recent.maxlen
        if warm and waiting[ready[0]].overtaken < self.window:
            chosen = next((i for i in ready if self._hot(waiting[i])), ready[0])
        # Every line older than the chosen one is overtaken once more. The oldest line has
        # always been overtaken the most (whatever overtook a younger line overtook it too),
        # so checking it alone above keeps every count <= window. (A long line waiting to
        # start last is not counted: it waits by design.)
        for i in ready:
            if i >= chosen:
                break
            waiting[i].overtaken += 1
        line = waiting.pop(chosen)
        if line.key is not None:
            self._forget(line)
            self._recent.append(line.key)
        return line.seq, line.item

    def only_last_wait(self) -> bool:
        """Whether the lines waiting are all lines that start last (and some wait)."""
        return bool(self._waiting) and self.last is not None and all(line.last for line in self._waiting)

    def _forget(self, line: _Waiting) -> None:
        at = bisect.bisect_left(self._sorted, (line.key, line.seq))
        del self._sorted[at]
        del self._by_seq[line.seq]

    def _hot(self, line: _Waiting) -> bool:
        """Whether `line` would find in the slots all it shares with other lines: it reuses a
        cached prefix (at least MIN_SHARED) and nothing else it shares is missing. An
        embeddings line is always ready (it holds no prefix and takes none from the slots)."""
        if line.key is None:
            return True
        cached = self._cached(line.key)
        return cached >= self.min_shared and line.shared - cached < self.min_shared

    def _cached(self, key: str) -> int:
        return max((common_prefix(key, started) for started in self._recent), default=0)

    def drain(self) -> list[tuple[int, Any]]:
        """Every waiting line, in read order; none waits afterwards (the run is stopping)."""
        lines, self._waiting = self._waiting, []
        self._sorted, self._by_seq = [], {}
        return [(line.seq, line.item) for line in lines]
