"""The worker side of `run --ray`: one Engine in a Ray actor process (pool.py drives it).

A threaded actor: lines come in several at a time, with a `take` (or by `put` when the driver
can't wait for its take to return), and join the engine's running batch like any other submit;
their Results go back by `take`, all that finished since the last one; `progress` answers the
driver's watchdog beside them.
"""
from __future__ import annotations

import collections
import os
import socket
import threading
import time
from typing import Any

import ray

from ..config import EngineConfig
from ..core.engine import EngineCore
from ..core.telemetry import TickRecord
from ..core.engine_base import error_result
from ..errors import LlamaBatchError
from ..in_process.runners import RunnerChoice
from ..params import SamplingParams
from ..results import Result
from ..supervised.watchdog import RECENT_TICKS
from ..version import __version__


class EngineWorker:
    """One engine in a Ray actor (a threaded one: `take` waits beside `put`, `cancel`, `progress`)."""

    def __init__(self, config: EngineConfig, default_params: SamplingParams, max_slots: int | None = None,
                 runner: RunnerChoice | None = None, extra_slots: int = 0):
        self._config = config
        self._extra_slots = extra_slots  # serve's --online-slots: reserved on this engine for online requests
        self._defaults = default_params
        self._max_slots = max_slots  # n_parallel "auto": never more slots than the run has lines
        self._runner = runner  # a registered runner instead of the model (tests)
        self._engine: EngineCore | None = None
        self._handles: dict[int, Any] = {}  # key -> its engine handle, while it runs
        self._cancelled: set[int] = set()  # keys cancelled before their line arrived
        self._results: list[tuple[int, Result]] = []  # finished, for the next take
        self._urgent: set[int] = set()  # keys of lines above the default priority (online requests)
        self._hurry = False  # one of them finished: the take out answers now, lingering no more
        self._ready = threading.Condition()
        self._steps = 0  # engine steps finished, and the recent ones' wall times: the driver's watchdog
        self._recent_s: collections.deque[float] = collections.deque(maxlen=RECENT_TICKS)

    def start(self, driver_version: str | None = None) -> dict:
        """Load the model; say where we are and what we loaded (or why not). `driver_version`:
        the driver's llamabatch, which must be this node's too (lines and records cross the wire
        as its classes)."""
        info = {"node": ray.util.get_node_ip_address(), "host": socket.gethostname(), "pid": os.getpid()}
        if driver_version is not None and driver_version != __version__:
            return {**info, "error": f"llamabatch {__version__} is installed there and {driver_version} here: "
                                     "install the same version on every node"}
        if self._engine is None:
            try:
                # The model is resolved (the same absolute path on every node) and n_parallel
                # "auto" decided here, on this worker's node: its CPUs, its memory, its threads
                # (the calibration cache is per machine), bounded by the run's line count.
                from ..in_process.worker_engine import open_worker_engine
                from ..settings.ready import settings_for

                self._engine = open_worker_engine(settings_for(self._config, self._defaults), self._runner,
                                                  self._max_slots, self._extra_slots)
            except LlamaBatchError as exc:
                return {**info, "error": str(exc)}
            self._engine.subscribe(self._on_record)
        e = self._engine
        return {**info, "model_name": e.model_name, "slot_ctx": e.slot_ctx, "n_parallel": e.config.n_parallel,
                "reserved_slots": e.config.reserved_slots, "slots_reason": e.slots_reason}

    def _on_record(self, record: Any) -> None:
        if isinstance(record, TickRecord):
            self._recent_s.append(record.wall_ms / 1000)
            self._steps += 1

    def progress(self) -> tuple[int, float]:
        """(engine steps finished so far, the longest recent step in seconds). A threaded actor
        answers this beside `put` and `take` calls, unless its whole process is stopped."""
        return self._steps, max(self._recent_s, default=0.0)

    def put(self, items: list[tuple[int, Any, SamplingParams | None]]) -> None:
        """Lines in, each (key, prompt, params): all the driver has for this worker at once, so
        a busy driver pays one call for several lines. Their Results come back through `take`."""
        if self._engine is None:  # restarted by Ray, not started yet: the driver's take sees the new pid
            return
        for key, prompt, params in items:
            if params is not None and params.priority < self._defaults.priority:
                with self._ready:
                    self._urgent.add(key)
            try:
                handle = self._engine.submit(prompt, params, stream=False,
                                             callback=lambda _h, event, key=key: self._finished(key, event))
            except LlamaBatchError as exc:  # refused (a prompt past the context ...): that line's error
                self._finished(key, error_result(-1, str(exc), exc.code))
                continue
            with self._ready:
                if key in self._cancelled:  # the cancel overtook this line
                    self._cancelled.discard(key)
                    handle.cancel()
                elif not handle.done:
                    self._handles[key] = handle

    def _finished(self, key: int, event: Any) -> None:
        if isinstance(event, Result):
            with self._ready:
                self._handles.pop(key, None)
                self._results.append((key, event))
                if key in self._urgent:
                    self._urgent.discard(key)
                    self._hurry = True
                self._ready.notify()

    def take(self, wait_s: float, items: list[tuple[int, Any, SamplingParams | None]] | None = None,
             want: int = 1, linger_s: float = 0.0) -> tuple[int, list[tuple[int, Result]]]:
        """(this process's pid, every (key, Result) finished since the last take), after putting
        `items` (one call both hands lines out and collects), waiting up to `wait_s` for a
        result, then up to `linger_s` more while fewer than `want` have finished, lines still run
        and none of those finished is urgent (an online request's answer waits for no other): a
        busy worker's answers come back a bunch per call, not a tick's few. The pid tells the
        driver a process Ray restarted behind its back."""
        if items:
            self.put(items)
        with self._ready:
            if not self._results:
                self._ready.wait(wait_s)
            if self._results and len(self._results) < want and linger_s > 0:
                end = time.monotonic() + linger_s
                while (len(self._results) < want and self._handles and not self._hurry
                       and self._ready.wait(end - time.monotonic())):
                    pass
            taken, self._results, self._hurry = self._results, [], False
        return os.getpid(), taken

    def cancel(self, key: int) -> None:
        with self._ready:
            handle = self._handles.get(key)
            if handle is None:
                self._cancelled.add(key)
        if handle is not None:
            handle.cancel()

    def close(self) -> None:
        """Stop the engine (a worker in this process: tests; Ray ends an actor by killing it)."""
        if self._engine is not None:
            self._engine.close()

    def tokenize(self, text: str, special: bool, add_special: bool = True) -> list[int]:
        assert self._engine is not None, "tokenize before start"
        return self._engine.tokenize(text, special=special, add_special=add_special)

    def token_pieces(self, tokens: list[int]) -> list[bytes]:
        assert self._engine is not None, "token_pieces before start"
        return self._engine.token_pieces(tokens)


RemoteWorker = ray.remote(EngineWorker)
