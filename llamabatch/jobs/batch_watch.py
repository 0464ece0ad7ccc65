"""The job thread's watch over its batch loop (batch_loop.py), until every admitted line is
handled: progress snapshots, stop requests, and the bound on draining.

A stop request is `Job.cancel()`: the first stops admitting and lets in-flight lines finish,
the second cancels them (their lines get no record, so a resume runs them again). The wait
after the first is bounded (`drain_timeout`, and CANCEL_GRACE_S after the second): then the
lines still in flight are abandoned (no record) and the engine is stopped, so a hung engine
cannot keep the job alive.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from .batch_loop import BatchLoop
from .events import Abandoned, JobEvent, Progress, Stopping
from .reading.input_source import BackgroundCount
from .progress import Snapshot

CANCEL_GRACE_S = 5.0  # after the second stop request, cancelled lines get this long to end
FINAL_COUNT_WAIT_S = 2.0  # the most the end of a job waits for INPUT's count (a huge file: it says n/?)
POLL_S = 0.05  # how often stop requests and the drain bound are looked at
PROGRESS_EVERY_S = 0.25  # how often a Progress event is published


class StopRequests:
    """How far the caller asked the job to stop: 0 not, 1 stop reading, 2 cancel in flight too.
    Written by any thread (a signal handler included: a plain int, no lock), read by the watch."""

    def __init__(self) -> None:
        self.level = 0

    def ask(self, in_flight: bool) -> None:
        self.level = max(self.level, 2 if in_flight else 1)


def watch(run: BatchLoop, stops: StopRequests, publish: Callable[[JobEvent], None],
          counter: BackgroundCount | None, cluster: Any = None, drain_timeout: float | None = None) -> None:
    """Until every admitted line is handled. `cluster` (on Ray: the RayPool) adds per-worker
    rates to progress and can stop the run (`fatal_error`: every worker gone; the lines it
    could not answer get no record). `drain_timeout`: seconds after the first stop request
    before the lines still in flight are abandoned and the engine stopped (None: no bound)."""
    acted_on = 0
    deadline: float | None = None  # when in-flight lines are abandoned
    shown = 0.0
    while not run.finished:
        if cluster is not None and cluster.fatal_error is not None and not run.stopping:
            run.stop_admitting()
        while stops.level > acted_on:
            acted_on += 1
            deadline = _act(run, acted_on, deadline, drain_timeout, publish)
        if deadline is not None and time.monotonic() >= deadline:
            deadline = None
            publish(Abandoned(run.abandon_inflight()))
        if run.writer.error is not None and not run.cancelled:
            run.cancel_inflight()
        if time.monotonic() - shown >= PROGRESS_EVERY_S:
            shown = time.monotonic()
            publish(Progress(snapshot(run, counter, cluster)))
        time.sleep(POLL_S)
    if counter is not None:
        counter.wait(FINAL_COUNT_WAIT_S)  # the last snapshot says n/TOTAL, not n/? on a busy machine
    publish(Progress(snapshot(run, counter, cluster)))


def _act(run: BatchLoop, level: int, deadline: float | None, drain_timeout: float | None,
         publish: Callable[[JobEvent], None]) -> float | None:
    """Act on stop request number `level`; the new abandon deadline."""
    now = time.monotonic()
    if level == 1:
        n = run.stop_admitting()
        publish(Stopping(n, False, drain_timeout))
        return None if drain_timeout is None else now + drain_timeout
    n = run.cancel_inflight()
    publish(Stopping(n, True, CANCEL_GRACE_S))
    grace = now + CANCEL_GRACE_S
    return grace if deadline is None else min(deadline, grace)


def snapshot(run: BatchLoop, counter: BackgroundCount | None, cluster: Any) -> Snapshot:
    snap = run.snapshot(counter)
    if cluster is not None:
        snap.extra = cluster.progress()
    return snap
