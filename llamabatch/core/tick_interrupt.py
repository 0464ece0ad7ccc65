"""Interrupting the tick in flight for a request that outranks every row of it.

Without this, a request of higher priority than every row of the decode running now waits for
that decode to end, and a decode tick of 8 rows on 2 cores takes about as long as a short
prompt's whole prefill: its time to first token comes to about 1.5x idle on average, at worst
twice. Where the runner can stop the decode part-way with nothing of it kept
(Runner.interruptible), such an arrival stops it; the engine counts that tick as not run, and
the next one is the urgent prompt's (the scheduler gives a higher-priority prompt's tick no
lower rows), then the others' rows again, unchanged. A decode more than half done (by the time
its graph runs took lately) is left to finish. A request interrupts at most the one tick
in flight when it arrives, so a steady stream of urgent requests costs the others a part of a
tick each; requests of equal priority never interrupt one another, and a tick that carries a
request the fair share admitted is never interrupted (the engine does not arm it), so that one
still finishes under an urgent arrival every tick.
"""
from __future__ import annotations

import time
from typing import Any, Iterable

# A decode found more than this share done is left to finish: stopping it would throw away more
# of the others' work than it saves the urgent request (who then waits at most the rest of it).
FINISH_PAST = 0.5
EWMA = 0.2  # weight of the newest tick in the running estimate of a graph run's time


class TickInterrupt:
    """The engine's side of Runner.interrupt. arm, disarm and arrived are called with the
    engine's lock held, so an arrival and the arming of the next decode never cross."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self._armed_below: int | None = None  # a priority below this interrupts the decode in flight
        self._started = 0.0
        self._expected_s: float | None = None  # how long the decode in flight should take
        self._run_s: float | None = None  # one graph run's time, a running estimate

    def arm(self, best_in_plan: int | None, waiting: Iterable[int], graph_runs: int = 1) -> None:
        """Before an interruptible decode of `graph_runs` graph runs whose most urgent row has
        priority `best_in_plan` (None: the plan cannot be interrupted); `waiting` holds the
        priorities of what arrived since the plan was made, which may outrank it already."""
        self.runner.clear_interrupt()
        self._armed_below = best_in_plan
        self._started = time.perf_counter()
        self._expected_s = None if self._run_s is None else self._run_s * graph_runs
        if best_in_plan is not None and any(priority < best_in_plan for priority in waiting):
            self.runner.interrupt()

    def disarm(self) -> None:
        """After the decode, whatever it returned."""
        if self._armed_below is not None:
            self._armed_below = None
            self.runner.clear_interrupt()

    def arrived(self, priority: int) -> None:
        if self._armed_below is None or priority >= self._armed_below:
            return
        if self._expected_s is not None and time.perf_counter() - self._started > FINISH_PAST * self._expected_s:
            return
        self.runner.interrupt()

    def observe(self, eval_ms: float, graph_runs: int) -> None:
        """A decode that ran to its end: what its graph runs took."""
        if graph_runs > 0 and eval_ms > 0:
            run_s = eval_ms / 1000 / graph_runs
            self._run_s = run_s if self._run_s is None else (1 - EWMA) * self._run_s + EWMA * run_s
