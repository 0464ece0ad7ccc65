"""WorkLane: one kind of work the engine thread moves every tick (generation_lane.py,
embedding_lane.py), behind the few calls the tick loop, shutdown and failure make.

The loop hands a lane the requests accepted for it and their cancels, asks it to end what
has timed out, and to step; shutdown and a failed thread end every lane's requests the same
way. A lane ends a request through OpenRequests (open_requests.py): one Result each.
"""
from __future__ import annotations

from typing import Any, Protocol


class WorkLane(Protocol):
    def take(self, item: Any) -> None:
        """Queue a request accepted for this lane (on the engine thread)."""

    def cancel(self, item: Any) -> None:
        """End `item` with finish_reason 'cancelled', unless it has ended already."""

    def expire(self, now: float) -> None:
        """End every request whose deadline is at or before `now` with 'timeout'."""

    def next_deadline(self) -> float | None:
        """The earliest deadline of a request in the lane (an idle loop wakes for it)."""

    def has_work(self) -> bool:
        """Whether a step now would move something (else the loop may sleep)."""

    def step(self, tick_start: float) -> None:
        """Run this tick's share of the lane: at most one llama_decode of its own."""

    def end_all(self, reason: str, error: str | None = None, code: str | None = None) -> None:
        """End every request in the lane with `reason` (shutdown: cancelled; a failure: error)."""

    def close(self) -> None:
        """Stop what the lane runs beside the engine thread; called after end_all."""
