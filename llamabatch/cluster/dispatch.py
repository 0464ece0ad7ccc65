"""Which worker runs which line, for `run --ray`'s driver: pure bookkeeping, no ray import.

The pool (pool.py, and its watcher.py) reports what happened — a line submitted, answered
or cancelled, a worker dead, back after a restart, or gone — and the Dispatcher decides what runs where,
calling `send(line, worker)` for each line it hands out. Each method returns the lines that
now have their outcome, as (line, Result) pairs for run's batch loop. The pool calls it
under one lock; it never blocks.

Backpressure: a worker holds at most `cap` lines (its slots plus as many queued in its
engine); the rest wait here, and run's reader stops reading when `--max-inflight` lines
are out. Crashes follow the shared poison-line rule (llamabatch/core/poison.py): the dead worker's
in-flight lines become suspects, run again in quarantine groups on a worker with nothing
else in flight, and a line convicted by the rule gets an `engine_crashed` error record.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.poison import PoisonRule
from .affinity import PrefixAffinity
from .plan import WorkerTally
from ..core.engine_base import ended_result, error_result
from ..results import Result

READY, RESTARTING, GONE = "ready", "restarting", "gone"
DISCONNECTED = "disconnected"  # the driver lost its Ray session: every worker waits for it to come back


def cancelled_result() -> Result:
    """No answer: run's writer skips the line and --resume runs it again. (request_id -1: the
    pool sets the line's own.)"""
    return ended_result(-1, "cancelled")


def crashed_result(message: str) -> Result:
    return error_result(-1, message, "engine_crashed")


@dataclass(eq=False)
class Line:
    key: int
    prompt: Any
    params: Any
    handle: Any = None  # the caller's RequestHandle
    worker: "WorkerState | None" = None
    retried: bool = False  # it was in flight when a worker died
    cancel_asked: bool = False
    ref: Any = None  # the pool's handle on the call running it
    priority: int = 0  # lower runs sooner (SamplingParams.priority): serve's online requests go first
    prefixes: list = field(default_factory=list)  # an online line's prefix hashes (affinity.py)

    def __lt__(self, other: "Line") -> bool:  # the waiting heap's order: priority, then arrival
        return (self.priority, self.key) < (other.priority, other.key)


@dataclass(eq=False)
class WorkerState:
    tally: WorkerTally
    cap: int
    n_parallel: int  # its engine's slots, the reserved ones included
    state: str = READY
    reserved: int = 0  # of n_parallel, slots its engine keeps for online requests (serve's --online-slots)
    node_id: str = ""  # Ray's id of its node (the header and manifest name it)
    inflight: dict[int, Line] = field(default_factory=dict)
    quarantine: set[int] = field(default_factory=set)  # the suspect group it runs, alone
    draining: bool = False  # kept free of fresh lines until a suspect group can have it
    slot_ctx: int = 0  # tokens one of its slots holds (the header line says it)
    slots_reason: str = ""  # with n_parallel "auto": why its engine chose n_parallel slots
    # the pool's own fields (Ray handles, timers)
    actor: Any = None
    start_ref: Any = None
    down_since: float = 0.0
    ask_again_at: float = 0.0
    watchdog: Any = None  # llamabatch.supervised.watchdog.Watchdog, fed by the pool
    progress_ref: Any = None  # a progress() question not answered yet
    take_ref: Any = None  # the take() out on it: its next finished lines
    outbox: list = field(default_factory=list)  # lines sent to it, for the watcher's next put()
    ask_progress_at: float = 0.0
    steps_seen: int = -1
    kill_reason: str | None = None  # set when the pool killed it as hung

    @property
    def batch_slots(self) -> int:
        """Its engine's slots for batch lines: all but those reserved for online requests."""
        return self.n_parallel - self.reserved


Outcomes = list[tuple[Line, Result]]


class Dispatcher:
    def __init__(self, workers: list[WorkerState], send: Callable[[Line, WorkerState], None],
                 cancel_remote: Callable[[Line], None], rule: PoisonRule | None = None, urgent_below: int = 0,
                 affinity: PrefixAffinity | None = None):
        """`urgent_below`: a line with a lower priority number (serve's online requests) may go
        past a worker's cap by its slots: its engine admits it ahead of the queued lines there.
        `affinity`: where such lines' prefixes ran last (None: they go by queue length alone)."""
        self.workers = workers
        self.rule: PoisonRule = rule or PoisonRule()
        self.fatal_error: str | None = None
        self.retries = 0  # lines run again after a worker died with them
        self.isolated: list[Any] = []  # handles' ids of lines convicted as poison
        self._send_call = send
        self._cancel_remote = cancel_remote
        self._pending: list[Line] = []  # a heap: the most urgent, then the oldest, first
        self.urgent_below = urgent_below
        self._held: dict[int, Line] = {}  # suspects, waiting for their quarantine group's turn
        self.affinity = affinity
        self.pauses = 0  # times the driver lost the cluster and waited for it
        self.rerun = 0  # lines in flight then, run again from the start when it came back

    @property
    def waiting(self) -> int:
        return len(self._pending) + len(self._held)

    # -- events ------------------------------------------------------------------------------

    def submit(self, line: Line) -> Outcomes:
        if self.fatal_error is not None:
            return [(line, cancelled_result())]
        heapq.heappush(self._pending, line)
        self._dispatch()
        return []

    def answered(self, line: Line, result: Result) -> Outcomes:
        worker = line.worker
        if worker is None or worker.inflight.get(line.key) is not line:
            return []  # from a worker already counted as dead: the line runs (or ran) elsewhere
        self._leave(worker, line)
        if not result.error:
            worker.tally.lines += 1
            worker.tally.generated += result.usage.completion_tokens
        self._dispatch()
        return [(line, result)]

    def died(self, worker: WorkerState, why: str) -> Outcomes:
        """The worker's process is gone (Ray restarts it): its lines are suspects now."""
        lost = sorted(worker.inflight.values(), key=lambda l: l.key)
        worker.inflight.clear()
        worker.quarantine.clear()
        worker.draining = False
        worker.state = RESTARTING
        worker.tally.restarts += 1
        worker.tally.died_with += len(lost)
        worker.tally.death = why
        worker.tally.inflight = 0
        out: Outcomes = []
        suspects = []
        for line in lost:
            line.worker = None
            if line.cancel_asked:  # cancelled (second Ctrl-C): no answer, --resume runs it
                self.rule.finished(line.key)
                out.append((line, cancelled_result()))
            else:
                suspects.append(line)
        if suspects:
            verdict = self.rule.crashed([l.key for l in suspects])
            by_key = {l.key: l for l in suspects}
            for key in verdict.poisoned:
                line = by_key[key]
                self.isolated.append(key)
                out.append((line, crashed_result(
                    f"a Ray worker died each time this line ran, the last time with nothing else on it "
                    f"({worker.tally.name} on {worker.tally.node}: {why})")))
            for key in verdict.retry:
                by_key[key].retried = True
                self._held[key] = by_key[key]
            self.retries += len(verdict.retry)
        self._dispatch()
        return out + self._all_gone()

    def back(self, worker: WorkerState, pid: int) -> Outcomes:
        worker.state = READY
        worker.tally.pid = pid
        self._dispatch()
        return []

    def disconnected(self) -> Outcomes:
        """The driver lost its Ray session (its workers went with it): every line in flight goes
        back to the waiting ones, as not run (no suspect of a crash, no retry counted), and no
        line is handed out until `reconnected`. A line whose cancel was asked is cancelled."""
        self.pauses += 1
        out: Outcomes = []
        for worker in self.workers:
            if worker.state == GONE:
                continue
            for line in sorted(worker.inflight.values(), key=lambda l: l.key):
                line.worker = None
                if line.cancel_asked:
                    self.rule.finished(line.key)
                    out.append((line, cancelled_result()))
                else:
                    self.rerun += 1
                    heapq.heappush(self._pending, line)
            worker.inflight.clear()
            worker.quarantine.clear()
            worker.draining = False
            worker.tally.inflight = 0
            worker.state = DISCONNECTED
        return out

    def reconnected(self) -> Outcomes:
        """Fresh workers in a new session: the waiting lines go out again."""
        for worker in self.workers:
            if worker.state == DISCONNECTED:
                worker.state = READY
        self._dispatch()
        return []

    def gone(self, worker: WorkerState, why: str) -> Outcomes:
        """The worker can't come back (its node is lost, restarts used up)."""
        worker.state = GONE
        worker.tally.alive = False
        worker.tally.death = why
        worker.tally.stop()
        self._dispatch()
        return self._all_gone()

    def cancel(self, key: int) -> Outcomes:
        for line in self._pending:
            if line.key == key:
                self._pending.remove(line)
                heapq.heapify(self._pending)
                return [(line, cancelled_result())]
        line = self._held.pop(key, None)
        if line is not None:
            self.rule.finished(key)
            return [(line, cancelled_result())]
        for worker in self.workers:
            line = worker.inflight.get(key)
            if line is not None and not line.cancel_asked:
                line.cancel_asked = True
                self._cancel_remote(line)
        return []

    # -- handing lines out -------------------------------------------------------------------

    def _dispatch(self) -> None:
        ready = [w for w in self.workers if w.state == READY]
        # Suspects first, each group on a worker with nothing else in flight.
        while self.rule.groups_waiting:
            idle = [w for w in ready if not w.inflight]
            if not idle:
                if not any(w.draining for w in ready):
                    free = [w for w in ready if not w.quarantine]
                    if free:  # stop feeding the least busy worker until it is empty
                        min(free, key=lambda w: len(w.inflight)).draining = True
                break
            worker = idle[0]
            worker.draining = False
            for key in self.rule.next_group():
                line = self._held.pop(key, None)
                if line is not None:
                    worker.quarantine.add(key)
                    self._send(line, worker)
        if not self.rule.groups_waiting:
            for w in ready:
                w.draining = False
        # Fresh lines, the most urgent first, to the worker with the shortest queue that has room.
        while self._pending:
            line = self._pending[0]
            extra = 0 if line.priority >= self.urgent_below else 1
            room = [w for w in ready if not w.quarantine and not w.draining
                    and len(w.inflight) < w.cap + extra * w.n_parallel]
            if not room:
                return
            heapq.heappop(self._pending)
            self._send(line, self._choose(line, room))

    def _choose(self, line: Line, room: list[WorkerState]) -> WorkerState:
        """The worker with the shortest queue; for a line with prefixes, the worker that ran its
        longest known prefix last instead, while that one's queue is at most the shortest's plus
        half its batch slots (at least 1): a cached prefix is worth a short wait, not a long one."""
        shortest = min(room, key=lambda w: len(w.inflight))
        if not line.prefixes or self.affinity is None:
            return shortest
        chosen = shortest
        known = self.affinity.worker_for(line.prefixes)
        for w in room:
            slack = max(1, w.batch_slots // 2)
            if w.tally.name == known and len(w.inflight) <= len(shortest.inflight) + slack:
                chosen = w
        self.affinity.remember(line.prefixes, chosen.tally.name)
        return chosen

    def _send(self, line: Line, worker: WorkerState) -> None:
        line.worker = worker
        worker.inflight[line.key] = line
        worker.tally.inflight = len(worker.inflight)
        if line.retried:
            worker.tally.retried_here += 1
        self._send_call(line, worker)
        if line.cancel_asked:
            self._cancel_remote(line)

    def _leave(self, worker: WorkerState, line: Line) -> None:
        del worker.inflight[line.key]
        worker.quarantine.discard(line.key)
        worker.tally.inflight = len(worker.inflight)
        line.worker = None
        self.rule.finished(line.key)

    def _all_gone(self) -> Outcomes:
        if self.fatal_error is not None or any(w.state != GONE for w in self.workers):
            return []
        last = self.workers[-1].tally
        self.fatal_error = (f"every Ray worker is gone ({len(self.workers)} of {len(self.workers)}; "
                            f"last: {last.name} on {last.node}: {last.death})")
        out = [(line, cancelled_result()) for line in [*self._pending, *self._held.values()]]
        for key in self._held:
            self.rule.finished(key)
        self._pending.clear()
        self._held.clear()
        return out
