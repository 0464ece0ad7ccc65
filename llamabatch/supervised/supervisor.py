"""The supervisor thread of SupervisedEngine (engine.py): it starts every child, reads the
child's frames, delivers Deltas and Results, and restarts the child when it dies.

A crash puts the requests that were in the dead child before the poison rule
(llamabatch/core/poison.py): the one to blame ends with `engine_crashed`, the others are
retried; a child that keeps dying while it starts, or crashes on everything, stops the engine
with every request ended `engine_unavailable`.

The Supervisor is the thread's half of the engine: it reads and changes the engine's request
state under the engine's `_lock`, as the engine's caller side does; deliveries to callers are
made with the lock released.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import TYPE_CHECKING, Callable

from ..core.engine_base import ended_result, error_result
from ..core.telemetry import RequestRecord
from ..errors import EngineClosed, LlamaBatchError, ModelLoadError
from ..results import Result
from . import wire
from .canary import CANARY_PID, engine_error, settings_hint
from .child_process import ChildProcess, StartFailed
from .flight import Flight
from .watchdog import load_bound

if TYPE_CHECKING:
    from .engine import SupervisedEngine

log = logging.getLogger("llamabatch.supervised")

ENGINE_CRASHED = "engine_crashed"  # this request was in flight in the crashes that isolated it
ENGINE_UNAVAILABLE = "engine_unavailable"  # no child could be started again: the request never ran to the end
START_ATTEMPTS = 3  # a child that dies this many times in a row before it is ready is not restarted again
# Crashes in a row with no request finishing in between: the child dies whatever it runs (a
# broken build, a bad machine), so stop rather than loop. One poison line takes at most 3.
MAX_FRUITLESS_CRASHES = 8


class Supervisor:
    """Starts, watches and restarts the children of one SupervisedEngine (its `run` is the
    supervisor thread); `busy` and `hung` are the engine watchdog's two questions."""

    def __init__(self, engine: "SupervisedEngine"):
        self.engine = engine
        self.first_load_s: float | None = None  # the measure of a restart's load bound
        self.ticked = False  # some child of this engine has finished a step
        self.fruitless = 0  # crashes since a request last finished in a child
        self.notices_said: set[str] = set()  # what the child's engine said: once per engine, not per child

    def run(self) -> None:
        """The supervisor thread: the first child (the constructor waits for it), then every restart."""
        e = self.engine
        try:
            try:
                child = self.start_child()
                with e._lock:
                    e._child = child
            except BaseException as exc:
                e._start_error = exc
                return
            finally:
                e._started.set()  # the constructor reads _child or _start_error
            self.supervise_children()
        except BaseException as exc:  # never leave a caller waiting on a dead supervisor
            log.exception("the supervisor thread failed")
            self.give_up(f"the engine supervisor failed: {exc}")
        finally:
            e._watchdog.stop()

    def start_child(self) -> ChildProcess:
        e = self.engine
        deaths = []
        # The first load is not bounded (it can take minutes; the user sees it and can stop it);
        # a restart's is, by the first one's time.
        bound = None
        if self.first_load_s is not None and e._watchdog.enabled:
            bound = load_bound(self.first_load_s, e._watchdog.floor_s)
        for _ in range(START_ATTEMPTS):
            if e._closing:
                raise EngineClosed("the engine is closed")
            started = time.monotonic()
            child = ChildProcess(e._child_config, e.default_params, e._env, e._runner)
            with e._lock:
                e._starting = child
                closing = e._closing
            if closing:  # close() came while it was spawned and did not see it
                child.kill("killed: the engine was closed while it started")
            try:
                child.wait_ready(bound)
                log.debug("engine process %s ready", child.proc.pid)
                if self.first_load_s is None:
                    self.first_load_s = time.monotonic() - started
                return child
            except StartFailed as exc:
                deaths.append(str(exc))
                child.close_pipes()
            finally:
                with e._lock:
                    e._starting = None
        if e._closing:
            raise EngineClosed("the engine is closed")
        hint = settings_hint(e.config)
        raise ModelLoadError(f"the engine process died {len(deaths)} times while loading {e.model_path} "
                             f"({deaths[-1]})" + (f"; check these settings: {hint}" if hint else ""))

    def busy(self) -> int:
        """Requests in flight in the child (the canary counts): the watchdog is armed while > 0."""
        e = self.engine
        return len(e._in_child) + (e._canary == "running")

    def hung(self, reason: str) -> None:
        """The watchdog fired: kill the child; the supervisor thread sees it die as a crash."""
        e = self.engine
        child = e._child
        if child is not None:
            e.hangs += 1
            child.kill(reason)
            try:  # said when it happens (not once per engine like other notices): a hang is an event
                e.on_notice(f"the engine process {child.proc.pid} was {reason}; its requests are retried in a "
                            "new one")
            except Exception:  # a caller's callback must not stop the watchdog
                log.exception("on_notice failed")

    def supervise_children(self) -> None:
        e = self.engine
        child = e._child
        while child is not None:
            try:
                while True:
                    self.on_frame(child.recv())
            except (EOFError, OSError):
                pass
            except Exception:  # a frame we cannot read: treat the child as dead
                log.exception("bad frame from the engine process")
                child.proc.kill()
            how = child.death()
            child.close_pipes()
            with e._lock:
                e._child = None
                if e._closing:
                    break
                ended, fatal = self.crashed(how)
                self.fruitless += 1
            for flight, result in ended:
                e._finish(flight, flight.handle, result)
            if fatal is None and self.fruitless >= MAX_FRUITLESS_CRASHES:
                fatal = (engine_error(self.fruitless, how, e.config, canary=False) if not self.ticked else
                         f"the engine process crashed {self.fruitless} times in a row with no request "
                         f"finishing ({how})")
            if fatal is not None:
                self.give_up(fatal)
                return
            try:
                child = self.start_child()
            except LlamaBatchError as exc:
                if e._closing:  # closed while it restarted: what is left ends cancelled
                    break
                self.give_up(f"the engine process could not be restarted: {exc}")
                return
            with e._lock:
                e.restarts += 1
                e._child = child
                if e._closing:
                    e._outgoing.put((child, wire.Close()))
                    continue  # read its last frames, then end as at close
                e._dispatch()
        self.end_all("cancelled", None, None)

    def crashed(self, how: str) -> tuple[list[tuple[Flight, Result]], str | None]:
        """The child died with `_in_child` in flight (under _lock): ask the rule who is to blame.
        Returns the requests that end now, and the engine error that stops the engine, if any."""
        e = self.engine
        in_flight = list(e._in_child.values())
        e._in_child.clear()
        e._slot_counts = (e.n_slots, 0, 0, 0, 0)
        for call in e._calls.values():
            call[2] = EngineClosed(f"the engine process died ({how})")
            call[0].set()
        e._calls.clear()
        if e._canary == "running":  # a built-in one-token request crashed it too
            return [], engine_error(e.rule.crash_total + 1, how, e.config, canary=True)
        if not self.ticked:  # no step ever finished: the engine itself may crash on everything
            e._canary = "waiting"
        ended = []
        for flight in in_flight:
            if flight.cancel_requested:  # its cancel died with the child: it ends as asked
                e._forget(flight)
                ended.append((flight, ended_result(flight.pid, "cancelled", seed=flight.params.seed)))
        suspects = [f for f in in_flight if not f.cancel_requested]
        for flight in suspects:
            flight.crashes.append(how)
        verdict = e.rule.crashed([f.pid for f in suspects])
        log.warning("the engine process died (%s) with %d request(s) in flight; retrying them", how, len(suspects))
        for pid in verdict.poisoned:
            flight = e._flights[pid]
            e._forget(flight)
            e.isolated.append(pid)
            message = (f"the engine process crashed {len(flight.crashes)} times with this request in flight, the last "
                       f"time with no other request in it ({how})")
            ended.append((flight, error_result(pid, message, ENGINE_CRASHED, seed=flight.params.seed)))
        return ended, None

    def on_frame(self, frame: wire.Frame) -> None:
        e = self.engine
        if not isinstance(frame, wire.Batch):
            return
        ticks = [item.record.wall_ms / 1000 for item in frame.items if isinstance(item, wire.Tick)]
        if ticks or any(isinstance(item, (wire.Streamed, wire.Finished)) for item in frame.items):
            # a step finished: progress (a tokenize reply alone is not: the engine may be stuck)
            e._watchdog.progress(ticks)
        out: list[Callable[[], None]] = []  # deliveries, made after _lock is released, in order
        with e._lock:
            e._slot_counts = dataclasses.astuple(frame.slots)
            if ticks:
                self.ticked = True
            for item in frame.items:
                self.on_item(item, out)
            e._dispatch()
        for deliver in out:
            deliver()

    def on_item(self, item: wire.Item, out: list[Callable[[], None]]) -> None:
        """One item of a child's Batch (under _lock): state changes now, deliveries into `out`."""
        e = self.engine
        if isinstance(item, (wire.Streamed, wire.Finished, wire.Started)) and item.pid == CANARY_PID:
            if isinstance(item, wire.Finished):  # it ran to the end: the engine works; the quarantine goes on
                log.info("the canary request finished (%s): the crash was not the engine's",
                         item.result.finish_reason)
                e._canary = None
            return
        if isinstance(item, wire.Streamed):
            flight = e._in_child.get(item.pid)
            delta = flight.new_part(item.text, item.token_ids, item.reasoning) if flight is not None else None
            if delta is not None:
                out.append(functools.partial(flight.handle._deliver, delta))
        elif isinstance(item, wire.Finished):
            flight = e._in_child.get(item.pid)
            if flight is not None:
                e._forget(flight)
                self.fruitless = 0
                result = dataclasses.replace(item.result, request_id=flight.pid)
                out.append(functools.partial(e._finish, flight, flight.handle, result))
        elif isinstance(item, wire.Notice):
            if item.line not in self.notices_said:  # once per engine, not once per child
                self.notices_said.add(item.line)
                out.append(lambda: e.on_notice(item.line))
        elif isinstance(item, wire.Tick):
            out.append(functools.partial(e.telemetry.record_tick, item.record))
        elif isinstance(item, wire.Started):
            out.append(functools.partial(e.telemetry.record_request, RequestRecord("start", item.pid)))
        elif isinstance(item, wire.Tokenized):
            call = e._calls.pop(item.call_id, None)
            if call is not None:
                call[1], call[2] = item.tokens, item.error
                call[0].set()

    def give_up(self, message: str) -> None:
        e = self.engine
        log.error("%s", message)
        e.fatal_error = message
        self.end_all("error", message, ENGINE_UNAVAILABLE)

    def end_all(self, reason: str, message: str | None, code: str | None) -> None:
        e = self.engine
        with e._lock:
            flights = list(e._flights.values())
            for flight in flights:
                e._forget(flight)
            for call in e._calls.values():
                call[2] = EngineClosed(message or "the engine is closed")
                call[0].set()
            e._calls.clear()
        for flight in flights:
            e._finish(flight, flight.handle, ended_result(flight.pid, reason, seed=flight.params.seed,
                                                             error=message, code=code))
