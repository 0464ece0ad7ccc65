"""Interrupting the tick in flight for a request that outranks every row of it.

Without this, a request of higher priority than every row of the decode running now waits for
that decode to end, and a decode tick of 8 rows on 2 cores takes about as long as a short
prompt's whole prefill: its time to first token comes to about 1.5x idle on average, at worst
twice. Where the runner can stop the decode part-way with nothing of it kept
(Runner.interruptible), such an arrival stops it; the engine counts that tick as not run, and
the next one is the urgent prompt's (the scheduler gives a higher-priority prompt's tick no
lower rows), then the others' rows again, unchanged. A request interrupts at most the one tick
in flight when it arrives, so a steady stream of urgent requests costs the others a part of a
tick each; requests of equal priority never interrupt one another, and a tick that carries a
request the fair share admitted is never interrupted (the engine does not arm it), so that one
still finishes under an urgent arrival every tick.
"""
from __future__ import annotations

from typing import Any, Iterable


class TickInterrupt:
    """The engine's side of Runner.interrupt. Every method is called with the engine's lock
    held, so an arrival and the arming of the next decode never cross."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self._armed_below: int | None = None  # a priority below this interrupts the decode in flight

    def arm(self, best_in_plan: int | None, waiting: Iterable[Any]) -> None:
        """Before an interruptible decode whose most urgent row has priority `best_in_plan`
        (None: the plan cannot be interrupted); `waiting` holds what arrived since the plan was
        made, which may outrank it already."""
        self.runner.clear_interrupt()
        self._armed_below = best_in_plan
        if best_in_plan is not None and any(priority < best_in_plan for priority in waiting):
            self.runner.interrupt()

    def disarm(self) -> None:
        """After the decode, whatever it returned."""
        if self._armed_below is not None:
            self._armed_below = None
            self.runner.clear_interrupt()

    def arrived(self, priority: int) -> None:
        if self._armed_below is not None and priority < self._armed_below:
            self.runner.interrupt()
