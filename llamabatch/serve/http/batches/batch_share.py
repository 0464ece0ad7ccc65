"""One gate over the engine for every running batch: the batch lines the engine may hold
(service.batch_inflight) are places, and each place that frees goes to the next running batch's
lane that has a line waiting.

Fair by places taken: the place goes to the waiting lane that has taken the fewest, ties in
turn (round robin from the lane after the last one served), so batches with lines to run take
places one for one. A lane that joins (a batch starts) or has lines again after none starts
level with the others less half the lines each holds in the engine: those are about the lines
queued there (a slot and one queued behind each), which run before its first line can, so it
is owed them. A 10-line batch created beside a 2,000-line one thus takes every place that
frees until it has caught up, and its last lines go in a generation sooner than by turns alone
(measured in docs/serve.md). The engine never holds more batch lines in all than one batch
alone would: the big batch loses only the places the small one uses. Online requests are not
counted here; they go ahead of batch lines by priority in the engine (online.py), as with one
batch.

The share's lock is every lane's lock: a place is taken and a line sent under it, from a job's
thread (a line submitted) or the engine's (a line ended, so its place is handed on in the tick
it frees).
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .batch_lane import BatchLane


class BatchShare:
    def __init__(self, places: Callable[[], int]):
        self._places = places  # read on every hand-out: the service may change it
        self._lanes: list["BatchLane"] = []
        self._turn = 0  # where the next tie is looked for first
        self.sent = 0  # batch lines in the engine now, every lane's
        self.lock = threading.RLock()

    def join(self, lane: "BatchLane") -> None:
        with self.lock:
            lane.taken = self._level()
            self._lanes.append(lane)

    def waits(self, lane: "BatchLane") -> None:
        """The lane has a line to send after it had none: it is not owed the turns it had nothing
        for (a lane idle for a while would otherwise take every place until it caught up)."""
        with self.lock:
            lane.taken = max(lane.taken, self._level(but=lane))

    def _level(self, but: "BatchLane | None" = None) -> int:
        """Where a lane joining now starts: the fewest places taken by the lanes waiting, less
        half the lines each holds in the engine (those queued ahead of the newcomer's)."""
        return min((other.taken - other.sent // 2 for other in self._lanes if other is not but and other.waiting),
                   default=0)

    def leave(self, lane: "BatchLane") -> None:
        """The lane's batch is over: it takes no more places (its lines still in the engine give
        theirs back as they end)."""
        with self.lock:
            if lane in self._lanes:
                i = self._lanes.index(lane)
                del self._lanes[i]
                if i < self._turn:
                    self._turn -= 1

    @property
    def lanes(self) -> int:
        with self.lock:
            return len(self._lanes)

    def feed(self) -> None:
        """Hand out what the places now allow (a line or an online request ended, a line came)."""
        with self.lock:
            while self.sent < self._places():
                lane = self._next_waiting()
                if lane is None:
                    return
                self.sent += 1
                if lane.send_next():
                    lane.taken += 1
                else:  # the engine refused it: the line ended, the place is free again
                    self.sent -= 1

    def ended_one(self) -> None:
        """A batch line ended in the engine: its place goes to the next lane in the same call."""
        with self.lock:
            self.sent -= 1
            self.feed()

    def _next_waiting(self) -> "BatchLane | None":
        n = len(self._lanes)
        best, best_at = None, -1
        for k in range(n):
            at = (self._turn + k) % n
            lane = self._lanes[at]
            if lane.waiting and (best is None or lane.taken < best.taken):
                best, best_at = lane, at
        if best is not None:
            self._turn = (best_at + 1) % n
        return best
