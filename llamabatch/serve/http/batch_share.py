"""One gate over the engine for every running batch: the batch lines the engine may hold
(service.batch_inflight) are places, and each place that frees goes to the next running batch's
lane that has a line waiting.

Fair by lines in the engine, not by lines sent: the place goes to the waiting lane with the
fewest lines in the engine now, ties in turn (round robin from the lane after the last one
served). So a 10-line batch created beside a 2,000-line one takes every other place that frees
until it holds as many as the big one, whatever the lengths of either's lines, and the engine
never holds more batch lines in all than one batch alone would: the big batch loses only the
places the small one uses. Online requests are not counted here; they go ahead of batch lines
by priority in the engine (online.py), as with one batch.

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
            self._lanes.append(lane)

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
                if not lane.send_next():  # the engine refused it: the line ended, the place is free again
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
            if lane.waiting and (best is None or lane.sent < best.sent):
                best, best_at = lane, at
        if best is not None:
            self._turn = (best_at + 1) % n
        return best
