"""The supervised engine's watchdog: a child with work in flight that makes no progress is killed.

A child can hang instead of dying (a llama.cpp call that never returns, a process stopped
with SIGSTOP, a machine swapping to a halt); without a watchdog every request in it, and
the command's shutdown, waits forever. Progress is any frame from the child: while work is
in flight the child's engine ticks, and every tick ends with one frame.

The bound is derived from the work, not a fixed guess: `margin` x the longest of the last
RECENT_TICKS ticks (their wall time, as the child measured it), never below `floor_s`. The
floor covers a first tick with nothing measured yet (a long prompt's first chunk on a big
model); the margin covers a tick that is slower than the recent ones (more rows, a bigger
chunk). Nothing in flight: not armed (an idle child sends nothing). The first model load is
not watched here (it can take minutes and the user sees it happen); a restart's load is
bounded by the supervised engine with `load_bound` below.

`Watchdog` is bookkeeping plus one thread; `overdue` is pure so tests drive it with a clock.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable

DEFAULT_FLOOR_S = 120.0  # the smallest bound: generous (a first long-prompt step of a big model on CPU can take a minute)
DEFAULT_MARGIN = 10.0  # x the longest recent tick
RECENT_TICKS = 64
LOAD_MARGIN = 10.0  # a restart may take this many times the first load...
LOAD_FLOOR_S = 120.0  # ...and never less than this


def load_bound(first_load_s: float, floor_s: float) -> float:
    """How long a restarted child may take to load the model: the first load is the measure."""
    return max(LOAD_FLOOR_S, floor_s, LOAD_MARGIN * first_load_s)


class Watchdog:
    """Calls `on_hang(reason)` once per stall when `busy()` and no progress for `bound()` seconds.

    floor_s <= 0 turns it off. `progress()` is called for every frame from the child, and
    when work goes from none to some (the stall clock starts when there is work to do).
    """

    def __init__(self, floor_s: float = DEFAULT_FLOOR_S, margin: float = DEFAULT_MARGIN, *,
                 busy: Callable[[], int], on_hang: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic):
        if margin < 1:
            raise ValueError("the watchdog margin must be >= 1")
        self.floor_s = floor_s
        self.margin = margin
        self._busy = busy  # how many requests are in flight in the child (0: not armed)
        self._on_hang = on_hang
        self._clock = clock
        self._ticks_s: collections.deque[float] = collections.deque(maxlen=RECENT_TICKS)
        self._last = clock()
        self._fired_at: float | None = None  # the stall already reported (one kill per stall)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.floor_s > 0

    def bound(self) -> float:
        longest = max(self._ticks_s, default=0.0)
        return max(self.floor_s, self.margin * longest)

    def progress(self, tick_wall_s: list[float] | None = None) -> None:
        self._ticks_s.extend(tick_wall_s or ())
        self._last = self._clock()
        self._fired_at = None

    def overdue(self) -> str | None:
        """Why the child counts as hung now, or None."""
        if not self.enabled or self._fired_at is not None:
            return None
        n = self._busy()
        if not n:
            return None
        quiet = self._clock() - self._last
        bound = self.bound()
        if quiet < bound:
            return None
        return (f"killed by the watchdog: no progress for {quiet:.1f}s with {n} request(s) in flight "
                f"(bound {bound:.1f}s: the larger of {self.floor_s:g}s and {self.margin:g} x the longest recent tick)")

    def check(self) -> None:
        reason = self.overdue()
        if reason is not None:
            self._fired_at = self._clock()
            self._on_hang(reason)

    # -- the thread ---------------------------------------------------------------------------

    def start(self) -> None:
        if not self.enabled:
            return
        self._thread = threading.Thread(target=self._run, name="llamabatch-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        # A tenth of the floor between looks (at most 1 s): a stall is seen within ~10% of its bound.
        period = min(1.0, max(0.01, self.floor_s / 10))
        while not self._stop.wait(period):
            self.check()
