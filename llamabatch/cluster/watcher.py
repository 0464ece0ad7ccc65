"""The Ray pool's calls to its workers, and the thread that watches them (pool.py's driver side).

One `take` call is out per worker all the time, each bringing back every line it finished
since the last and carrying the lines that waited for it (its outbox); a busy worker's take
holds its first answers until its queue is used up (or briefly), and lines go in a `put` of
their own only when its engine has a free slot or one is urgent: one Ray call per bunch of
lines, not per line, and for a busy worker one call both ways. Every call the
watcher waits on (a `take`, a `start` after a restart, a watchdog's `progress` question) is a
Ray ref whose end Ray's own thread hands to the watcher thread (`watch`: a callback on the
ref's future, no polling). Each one that finishes is a worker's finished lines, its death (a
failed `take`: its lines go back to the dispatcher, and Ray restarts the actor in place), a
restarted worker back, or a busy worker's step count for its watchdog. A worker with lines in flight that finishes no step for the watchdog's bound is
killed here, and its lines are handled as for any dead worker.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from typing import Any, Callable

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from ..supervised.watchdog import DEFAULT_MARGIN, Watchdog
from .affinity import PrefixAffinity
from .dispatch import READY, RESTARTING, Dispatcher, Line, Outcomes, WorkerState
from .ray_errors import death, first_line

log = logging.getLogger("llamabatch.ray")

RESTART_TIMEOUT_S = 300.0  # a worker not back by then (its node gone, no room) counts as gone
POLL_S = 0.05  # how long the watcher waits for a finished call before checking restarts and watchdogs
TAKE_WAIT_S = 1.0  # how long a worker's take() waits for a finished line before answering none
LINGER_S = 0.05  # how long a busy worker's take() may hold its first answers back for more
WAKE = None  # put on `finished` by send(): lines wait in an outbox for the watcher's next flush()
PROGRESS_EVERY_S = 1.0  # how often the watcher asks a busy worker how many steps its engine finished
REJOIN_EVERY_S = 2.0  # how often a driver that lost its Ray session tries to join the cluster again

Rejoin = Callable[[], list[WorkerState]]  # a new Ray session and fresh workers, or it raises


class Watcher:
    """The pool's Ray calls and its watcher thread. It shares the pool's lock: the dispatcher
    (built here, with `send` and `cancel_remote`) is called under it; `deliver` (the pool's)
    hands each outcome to its line's caller with the lock released."""

    def __init__(self, workers: list[WorkerState], lock: threading.Lock, deliver: Callable[[Outcomes], None],
                 watchdog_s: float, urgent_below: int = 0, affinity: PrefixAffinity | None = None,
                 rejoin: Rejoin | None = None, note: Callable[[str], None] = lambda _line: None):
        """`rejoin`: what to do when the driver's Ray session is lost (a Ray client whose
        connection stayed down past Ray's grace period): join again and start fresh workers.
        None: such a loss is fatal. `note`: a line for people when that happens and ends."""
        self.workers = workers
        self.lock = lock
        self.deliver = deliver
        self.dispatcher = Dispatcher(workers, self.send, self.cancel_remote, urgent_below=urgent_below,
                                     affinity=affinity)
        # Finished calls, put by Ray's own thread as each ends: waiting on them all with
        # ray.wait cost the driver a pass over every call in flight for each answer.
        self.finished: queue.SimpleQueue = queue.SimpleQueue()
        self.woken = False  # a WAKE is on `finished` already
        self.hangs = 0  # workers the watchdog killed
        self.closed = threading.Event()
        self.rejoin = rejoin
        self.note = note
        self.here = ray.util.get_node_ip_address()  # a hung worker on this node is also SIGKILLed by pid
        for w in workers:
            w.watchdog = Watchdog(watchdog_s, DEFAULT_MARGIN, busy=lambda w=w: len(w.inflight) if w.state == READY else 0,
                                  on_hang=lambda reason, w=w: self.kill_hung(w, reason))
        self.thread = threading.Thread(target=self.run, name="llamabatch-ray", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """End the watcher thread (the pool is closing): calls still out are not waited for, nor
        a join of the cluster under way after the session was lost."""
        self.closed.set()
        self.thread.join(timeout=30)

    # -- Ray calls (the dispatcher calls these under the lock) ------------------------------------

    def watch(self, ref: Any) -> Any:
        """`ref`, whose outcome reaches the watcher thread through `finished` when its call ends."""
        ref.future().add_done_callback(lambda future: self.finished.put((ref, future)))
        return ref

    def send(self, line: Line, worker: WorkerState) -> None:
        """Into the worker's outbox: the watcher thread puts what each outbox holds in one call
        (a line submitted alone goes at once; lines freed by a bunch of answers go together)."""
        if len(worker.inflight) == 1 and worker.watchdog is not None:  # it was idle: the stall clock starts now
            worker.watchdog.progress()
        worker.outbox.append(line)
        if not self.woken:
            self.woken = True
            self.finished.put(WAKE)

    def flush(self) -> None:
        """Each worker's outbox (under the lock), a line that went elsewhere since (its worker
        died) left out: with its next take() when none is out, else as `hand_out_now` says. So a
        busy worker costs one call per bunch of answers, its next lines riding on it."""
        self.woken = False
        urgent_below = self.dispatcher.urgent_below
        for w in self.workers:
            lines = [line for line in w.outbox if line.worker is w] if w.state == READY else []
            w.outbox = []
            if w.state == READY and w.take_ref is None:
                w.take_ref = self.watch(w.actor.take.remote(TAKE_WAIT_S, on_the_wire(lines),
                                                            *take_linger(w, urgent_below)))
            elif lines and hand_out_now(w, lines, urgent_below):
                w.actor.put.remote(on_the_wire(lines))
            else:
                w.outbox = lines

    def cancel_remote(self, line: Line) -> None:
        if line.worker is not None:
            try:
                line.worker.actor.cancel.remote(line.key)
            except Exception as exc:  # no session: the line is cancelled when the watcher sees the loss
                if not session_lost(exc):
                    raise

    # -- the watcher thread: results, deaths, restarts, hangs -------------------------------------

    def run(self) -> None:
        while not self.closed.is_set():
            try:
                self.turn()
            except Exception as exc:
                if not session_lost(exc):
                    raise
                self.paused(first_line(exc))

    def turn(self) -> None:
        """Restarts, watchdogs and outboxes, then every call that finished meanwhile."""
        with self.lock:
            outcomes = self.check_restarts()
            self.check_watchdogs()
            self.flush()
        self.deliver(outcomes)
        try:
            done = [self.finished.get(timeout=POLL_S)]
        except queue.Empty:
            return
        while True:
            try:
                done.append(self.finished.get_nowait())
            except queue.Empty:
                break
        for item in done:
            if item is not WAKE:
                self.deliver(self.collect(*item))

    def paused(self, why: str) -> None:
        """The Ray session is gone, and the workers with it: every line in flight waits again
        (not run, not failed), and the driver joins again every REJOIN_EVERY_S until it can
        start fresh workers, or the pool closes. Without `rejoin` every worker is gone."""
        with self.lock:
            waiting = self.dispatcher.waiting + sum(len(w.inflight) for w in self.workers)
            if self.rejoin is None:
                lost = f"the Ray session is lost: {why}"
                outcomes = [out for w in self.workers for out in self.dispatcher.gone(w, lost)]
            else:
                outcomes = self.dispatcher.disconnected()
            for w in self.workers:
                w.take_ref = w.progress_ref = w.start_ref = None
                w.outbox = []
                w.steps_seen = -1
        self.deliver(outcomes)
        if self.rejoin is None:
            return
        log.warning("the Ray session is lost (%s): %d line(s) wait; joining again", why, waiting)
        self.note(f"llamabatch run: the Ray cluster can't be reached ({why}): {waiting} line(s) wait, none failed; "
                  f"joining it again every {REJOIN_EVERY_S:g}s")
        while not self.closed.wait(REJOIN_EVERY_S):
            try:
                fresh = self.rejoin()
            except Exception as exc:  # RayStartError, or Ray's own while the cluster is still away
                log.info("joining the Ray cluster again failed: %s", first_line(exc))
                continue
            with self.lock:
                for old, new in zip(self.workers, fresh):
                    take_over(old, new)
                outcomes = self.dispatcher.reconnected()
            self.deliver(outcomes)
            self.note(f"llamabatch run: joined the Ray cluster again with {len(fresh)} fresh worker(s); "
                      "the lines go on")
            return

    def collect(self, ref: Any, future: Any) -> Outcomes:
        """One finished call: a worker's finished lines, its death, or a restarted worker back."""
        error: BaseException | None = None
        value: Any = None
        try:
            value = future.result()
        except Exception as exc:  # RayActorError: the worker died; RayTaskError (its cause's type too): it raised
            error = exc
        with self.lock:
            d = self.dispatcher
            worker = next((w for w in self.workers if w.progress_ref is not None and w.progress_ref == ref), None)
            if worker is not None:  # a watchdog question answered (a dead worker's is told by its lines)
                worker.progress_ref = None
                if error is None and worker.watchdog is not None and value[0] != worker.steps_seen:
                    worker.steps_seen = value[0]
                    worker.watchdog.progress([value[1]])
                return []
            worker = next((w for w in self.workers if w.start_ref is not None and w.start_ref == ref), None)
            if worker is not None:  # `start` after a death: back, or not coming back
                worker.start_ref = None
                if error is None and "error" not in value:
                    return d.back(worker, value["pid"])
                if isinstance(error, ActorUnavailableError):  # still restarting: ask again shortly
                    worker.ask_again_at = time.monotonic() + 0.5
                    return []
                return d.gone(worker, first_line(error) if error is not None else value["error"])
            worker = next((w for w in self.workers if w.take_ref is not None and w.take_ref == ref), None)
            if worker is None:
                return []  # a take of a worker already counted as dead
            worker.take_ref = None
            # a take answered by another process: it died and Ray restarted it between two takes
            restarted = error is None and value[0] != worker.tally.pid
            if error is None and not restarted:
                answered = [(worker.inflight.get(key), result) for key, result in value[1]]
                return [out for line, result in answered if line is not None for out in d.answered(line, result)]
            if error is not None and not isinstance(error, RayActorError):  # take() itself failed: ask again
                log.warning("take on worker %s failed: %s", worker.tally.name, first_line(error))
                return []
            worker.outbox = []
            why = "its process was restarted" if restarted else death(error)  # type: ignore[arg-type]
            outcomes = d.died(worker, worker.kill_reason or why)
            worker.kill_reason = None
            worker.progress_ref = None
            worker.steps_seen = -1  # a restarted engine counts from 0
            # Ray restarts the actor in place; `start` answers once it is back, or raises
            # if it can't come back (its node is gone, or its restarts are used up).
            worker.down_since = worker.ask_again_at = time.monotonic()
            log.info("worker %s died: %s", worker.tally.name, worker.tally.death)
            return outcomes

    def check_watchdogs(self) -> None:
        """Ask busy workers how many steps they finished (at most one question out per worker), and
        let each watchdog judge: a stopped worker never answers, so its clock runs out too."""
        now = time.monotonic()
        for w in self.workers:
            if w.watchdog is None or not w.watchdog.enabled or w.state != READY or not w.inflight:
                continue
            if w.progress_ref is None and now >= w.ask_progress_at:
                w.progress_ref = self.watch(w.actor.progress.remote())
                w.ask_progress_at = now + PROGRESS_EVERY_S
            w.watchdog.check()

    def kill_hung(self, worker: WorkerState, reason: str) -> None:
        """The watchdog fired (under self.lock): kill the actor's process. Its lines then fail with
        RayActorError and are retried as for any dead worker; Ray restarts it in place."""
        worker.kill_reason = reason
        self.hangs += 1
        log.warning("worker %s is hung; %s", worker.tally.name, reason)
        if worker.tally.node == self.here and worker.tally.pid:
            try:  # certain, also for a stopped process; ray.kill below tells Ray
                os.kill(worker.tally.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            ray.kill(worker.actor, no_restart=False)
        except Exception:  # already dead: its lines' errors say so
            pass

    def check_restarts(self) -> Outcomes:
        """Ask restarting workers whether they are back; give up on those that take too long."""
        now = time.monotonic()
        out: Outcomes = []
        for w in self.workers:
            if w.state != RESTARTING:
                continue
            if now - w.down_since > RESTART_TIMEOUT_S:
                w.start_ref = None
                out += self.dispatcher.gone(w, f"not back {RESTART_TIMEOUT_S:.0f}s after it died")
            elif w.start_ref is None and now >= w.ask_again_at:
                w.start_ref = self.watch(w.actor.start.remote())
        return out



def take_over(old: WorkerState, new: WorkerState) -> None:
    """`old` (its name, tallies and watchdog kept) is the fresh worker `new` from now on."""
    old.actor, old.tally.pid, old.tally.node, old.node_id = new.actor, new.tally.pid, new.tally.node, new.node_id
    old.n_parallel, old.reserved, old.cap, old.slot_ctx = new.n_parallel, new.reserved, new.cap, new.slot_ctx


def hand_out_now(w: WorkerState, lines: list[Line], urgent_below: int) -> bool:
    """Whether lines for a worker whose take() is out go now in a put() of their own: when its
    engine has a batch slot they could take, or one of them is urgent (an online request its
    engine admits ahead); else they wait for that take to come back (its engine could only queue
    them, and a take answers within a tick of a line finishing)."""
    return (len(w.inflight) - len(lines) < w.batch_slots
            or any(line.priority < urgent_below for line in lines))


def take_linger(w: WorkerState, urgent_below: int) -> tuple[int, float]:
    """A take()'s (want, linger_s): a worker with lines queued beyond its batch slots answers
    once as many have finished (its queue used up, what it needs more lines for) or LINGER_S
    after its first answer, so a call carries several ticks' answers; with an urgent line on it,
    at its first answer."""
    queued = len(w.inflight) - w.batch_slots
    if queued < 2 or any(line.priority < urgent_below for line in w.inflight.values()):
        return 1, 0.0
    return queued, LINGER_S


def on_the_wire(lines: list[Line]) -> list[tuple[int, Any, Any]]:
    """What a worker's put() or take() carries of each line."""
    return [(line.key, line.prompt, line.params) for line in lines]


def session_lost(exc: BaseException) -> bool:
    """Whether a Ray call failed because this driver has no Ray session any more (a Ray
    client's connection down past its grace period), not because of one worker."""
    return isinstance(exc, ConnectionError) or not ray.is_initialized() or "not connected" in str(exc)
