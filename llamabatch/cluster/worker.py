"""The worker side of `run --ray`: one Engine in a Ray actor process (pool.py drives it).

A threaded actor: lines come in as `generate` calls, several at a time, and join the engine's
running batch like any other submit; `progress` answers the driver's watchdog beside them.
"""
from __future__ import annotations

import collections
import os
import socket
import threading
from typing import Any

import ray

from ..config import EngineConfig
from ..core.engine import EngineCore
from ..core.telemetry import TickRecord
from ..errors import LlamaBatchError
from ..in_process.runners import RunnerChoice
from ..params import SamplingParams
from ..results import Result
from ..supervised.watchdog import RECENT_TICKS


class EngineWorker:
    """One engine in a Ray actor. Lines come in as `generate` calls, several at a time (a
    threaded actor), and join the engine's running batch like any other submit."""

    def __init__(self, config: EngineConfig, default_params: SamplingParams, max_slots: int | None = None,
                 runner: RunnerChoice | None = None):
        self._config = config
        self._defaults = default_params
        self._max_slots = max_slots  # n_parallel "auto": never more slots than the run has lines
        self._runner = runner  # a registered runner instead of the model (tests)
        self._engine: EngineCore | None = None
        self._handles: dict[int, Any] = {}
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()
        self._steps = 0  # engine steps finished, and the recent ones' wall times: the driver's watchdog
        self._recent_s: collections.deque[float] = collections.deque(maxlen=RECENT_TICKS)

    def start(self) -> dict:
        """Load the model; say where we are and what we loaded (or why not)."""
        info = {"node": ray.util.get_node_ip_address(), "host": socket.gethostname(), "pid": os.getpid()}
        if self._engine is None:
            try:
                # The model is resolved (the same absolute path on every node) and n_parallel
                # "auto" decided here, on this worker's node: its CPUs, its memory, its threads
                # (the calibration cache is per machine), bounded by the run's line count.
                from ..in_process.worker_engine import open_worker_engine
                from ..settings.given import settings_for

                self._engine = open_worker_engine(settings_for(self._config, self._defaults), self._runner,
                                                  self._max_slots)
            except LlamaBatchError as exc:
                return {**info, "error": str(exc)}
            self._engine.subscribe(self._on_record)
        e = self._engine
        return {**info, "model_name": e.model_name, "slot_ctx": e.slot_ctx, "n_parallel": e.config.n_parallel,
                "slots_reason": e.slots_reason}

    def _on_record(self, record: Any) -> None:
        if isinstance(record, TickRecord):
            self._recent_s.append(record.wall_ms / 1000)
            self._steps += 1

    def progress(self) -> tuple[int, float]:
        """(engine steps finished so far, the longest recent step in seconds). A threaded actor
        answers this beside running generate calls, unless its whole process is stopped."""
        return self._steps, max(self._recent_s, default=0.0)

    def generate(self, key: int, prompt: Any, params: SamplingParams | None) -> Result:
        assert self._engine is not None, "generate before start"
        handle = self._engine.submit(prompt, params, stream=False)
        with self._lock:
            if key in self._cancelled:  # the cancel overtook this call
                self._cancelled.discard(key)
                handle.cancel()
            else:
                self._handles[key] = handle
        try:
            return handle.result()
        finally:
            with self._lock:
                self._handles.pop(key, None)

    def cancel(self, key: int) -> None:
        with self._lock:
            handle = self._handles.get(key)
            if handle is None:
                self._cancelled.add(key)
        if handle is not None:
            handle.cancel()

    def tokenize(self, text: str, special: bool, add_special: bool = True) -> list[int]:
        assert self._engine is not None, "tokenize before start"
        return self._engine.tokenize(text, special=special, add_special=add_special)

    def token_pieces(self, tokens: list[int]) -> list[bytes]:
        assert self._engine is not None, "token_pieces before start"
        return self._engine.token_pieces(tokens)


RemoteWorker = ray.remote(EngineWorker)
