"""`run --ray`: one Engine per Ray actor, and a driver-side pool with the engine API
(llamabatch.api.EngineAPI): run's batch loop uses it exactly as it uses an Engine.

This module and the four it uses are the only ones that import ray, as llama/ is for
llama_cpp. Import it lazily: without Ray installed the import fails and the CLI prints how to
install the extra. What runs where is decided in dispatch.py (pure); the Ray side is starting
or joining Ray, placing and starting the actors (startup.py), the actor itself (worker.py),
the calls and watching them finish (watcher.py); this module is the pool the caller holds.

Why Ray core actors and our own dispatcher rather than Ray Data with an actor pool: run
already has a streaming reader, a reorder-buffer writer, --resume and per-line errors. Ray
Data would own the read and the write (its own datasource/datasink, its own ordering and
retries), so run's one code path for records would become two. With actors only the engine
moves: each actor owns a continuous-batching engine and gets lines, a bounded number at a
time, each answered as it finishes (sent and collected in bunches: watcher.py's put and take),
so a slow line never holds a block back and a dead worker costs exactly its in-flight lines,
which the driver knows by id.

Faults: an actor whose process dies is restarted in place by Ray (up to MAX_RESTARTS times)
and its in-flight lines are retried under the shared poison-line rule. A worker with lines in
flight whose engine finishes no step for the watchdog's bound (llamabatch/supervised/
watchdog.py: max(floor, margin x its longest recent step); a stopped process does not even
answer) is killed and handled the same way. A worker that can't
come back (its node is gone) is gone; when every worker is gone the pool sets `fatal_error`
and the unanswered lines get no record, so --resume finishes them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Iterator, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from ..config import EngineConfig
from ..core.engine import EngineStats
from ..core.handle import EventCallback, RequestHandle
from ..core.engine_base import EngineBase, check_room, record_outcome
from ..core.telemetry import Telemetry
from ..errors import EngineClosed, LlamaBatchError
from ..in_process.runners import RunnerChoice
from ..params import SamplingParams
from ..results import Delta
from ..supervised.watchdog import DEFAULT_FLOOR_S
from .affinity import PrefixAffinity, prefix_keys
from .describe import header, worker_row
from .dispatch import READY, Line, Outcomes, WorkerState, cancelled_result
from .ray_errors import RayStartError, death, first_line
from .startup import Started, open_ray, start_workers
from .watcher import Rejoin, Watcher
from .worker import EngineWorker

__all__ = ["RayPool", "RayStartError", "EngineWorker"]


class RayPool(EngineBase):
    """Engines on Ray workers behind one submit() (llamabatch.api.EngineAPI). Build it with
    `RayPool.start(...)`.

    What differs from an Engine, because each line runs as one call on a worker: a line's
    text comes back whole, so a streamed handle gets it as one Delta just before its Result;
    `subscribe` sees the driver's RequestRecords (the ticks happen on the workers); `hold`
    has nothing to hold (no tick spans the workers)."""

    recovers_crashes = True

    def __init__(self, workers: list[WorkerState], model_name: str, slot_ctx: int, owns_ray: bool, address: str,
                 watchdog_s: float = DEFAULT_FLOOR_S, config: EngineConfig | None = None,
                 default_params: SamplingParams | None = None, prefix_affinity: bool = True,
                 rejoin: Rejoin | None = None, note: Callable[[str], None] = lambda _m: None):
        """`prefix_affinity`: online requests (above the default priority) go to the worker
        that ran their prompt's longest known prefix last, unless it is busy (affinity.py).
        `rejoin`: a new Ray session and fresh workers, for when this one is lost (watcher.py)."""
        self.model_name = model_name
        self.slot_ctx = slot_ctx
        self.address = address  # "local" or what --ray was given
        # As start() was given them (n_parallel may be "auto": each worker chose its own).
        # max_queue is bounded here, for the whole pool: the workers' engines are not bounded.
        self.config = config or EngineConfig()
        self.default_params = default_params or SamplingParams()
        self._owns_ray = owns_ray
        self._ends_ray_session = True  # False when the caller had connected to Ray before start()
        self._workers = workers
        self._lock = threading.Lock()
        self._open: dict[int, Line] = {}  # every line without its outcome
        self._watcher = Watcher(workers, self._lock, self._deliver, watchdog_s, self.default_params.priority,
                                PrefixAffinity() if prefix_affinity else None, rejoin, note)
        self._dispatcher = self._watcher.dispatcher
        self._next_key = 0
        self.telemetry = Telemetry()
        self._closing = False
        self._watcher.start()

    # -- starting -------------------------------------------------------------------------------

    @classmethod
    def start(cls, config: EngineConfig, default_params: SamplingParams, *, address: str | None,
              workers: int | None, cpus_per_worker: int | None, gpus_per_worker: float,
              inflight_per_worker: int | None = None, log_to_driver: bool = False,
              note: Callable[[str], None] = lambda _m: None, max_slots: int | None = None,
              watchdog_s: float = DEFAULT_FLOOR_S, runner: RunnerChoice | None = None,
              extra_slots: int = 0, prefix_affinity: bool = True) -> "RayPool":
        """Connect to (or start) Ray, place the engines, load the model on every one, each with
        `extra_slots` more slots reserved for requests above the default priority (serve's online ones).

        Raises RayStartError before any line runs: no cluster, no room, a node without the model.
        """
        owns = address is None
        joined = open_ray(address, log_to_driver)

        def start() -> Started:
            return start_workers(config, default_params, owns, address or "local", workers, cpus_per_worker,
                                 gpus_per_worker, inflight_per_worker, note, max_slots, runner, extra_slots)

        def rejoin() -> list[WorkerState]:
            """The session was lost (its workers with it): a new one, fresh workers on it."""
            with contextlib.suppress(Exception):
                ray.shutdown()
            open_ray(address, log_to_driver)
            pool._ends_ray_session = True  # this session is the pool's own
            return start().workers

        try:
            started = start()
            pool = cls(started.workers, started.model_name, started.slot_ctx, owns, address or "local", watchdog_s,
                       started.config, default_params, prefix_affinity, rejoin if address is not None else None,
                       note)
        except BaseException:
            if not joined:
                ray.shutdown()
            raise
        pool._ends_ray_session = not joined
        return pool

    # -- the engine API (generate and the context manager: core/engine_base.py) ------------------------

    @property
    def fatal_error(self) -> str | None:  # type: ignore[override]
        """Set when every worker is gone."""
        return self._dispatcher.fatal_error

    @property
    def restarts(self) -> int:  # type: ignore[override]
        """Worker processes Ray restarted after they died (or the watchdog killed them)."""
        with self._lock:
            return sum(w.tally.restarts for w in self._workers)

    @property
    def hangs(self) -> int:  # type: ignore[override]
        return self._watcher.hangs

    @property
    def isolated(self) -> Sequence[int]:  # type: ignore[override]
        return list(self._dispatcher.isolated)

    @property
    def inflight_cap(self) -> int:
        """Lines the workers hold at once: run's --max-inflight default."""
        return sum(w.cap for w in self._workers)

    def submit(self, prompt: Any, params: SamplingParams | None = None, *, stream: bool = True,
               callback: EventCallback | None = None) -> RequestHandle:
        """Queue one line for the workers (see Engine.submit); QueueFull past max_queue."""
        priority = (params or self.default_params).priority
        urgent = priority < self.default_params.priority and self._dispatcher.affinity is not None
        prefixes = prefix_keys(prompt) if urgent else []  # hashed here, outside the pool's lock
        with self._lock:
            if self._closing:
                raise EngineClosed("the engine is closed")
            check_room(len(self._open), sum(w.n_parallel for w in self._workers), self.config.max_queue)
            key = self._next_key
            self._next_key += 1
            self.telemetry.totals.submitted += 1
            line = Line(key, prompt, self.on_the_wire(params), priority=priority,
                        handle=RequestHandle(self._cancel, key, stream, callback), prefixes=prefixes)
            self._open[key] = line
            outcomes = self._dispatcher.submit(line)
        self._deliver(outcomes)
        return line.handle

    def on_the_wire(self, params: SamplingParams | None) -> SamplingParams | None:
        """What a line sends of its params: None when they are the defaults every worker holds
        (most of a line's pickled bytes, and of the driver's time pickling it, saved)."""
        return None if params == self.default_params else params

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Nothing to hold: each line is a call of its own on a worker, and no tick spans workers."""
        yield

    def tokenize(self, text: str, *, special: bool = False, add_special: bool = True,
                 timeout: float = 60.0) -> list[int]:
        """Tokenize on a live worker (every worker loads the same model)."""
        return self._ask_worker(lambda actor: actor.tokenize.remote(text, special, add_special), "tokenize", timeout)

    def token_pieces(self, tokens: Sequence[int], *, timeout: float = 60.0) -> list[bytes]:
        """Each token's text, from a live worker's vocabulary."""
        return self._ask_worker(lambda actor: actor.token_pieces.remote(list(tokens)), "token_pieces", timeout)

    @property
    def ready(self) -> bool:
        return not self._closing and self.fatal_error is None and any(w.state == READY for w in self._workers)

    def _ask_worker(self, call: Callable[[Any], Any], what: str, timeout: float) -> Any:
        with self._lock:
            live = [w for w in self._workers if w.state == READY]
        if self._closing or not live:
            raise EngineClosed(self.fatal_error or "the engine is closed")
        try:
            return ray.get(call(live[0].actor), timeout=timeout)
        except GetTimeoutError:
            raise TimeoutError(f"{what} took more than {timeout}s") from None
        except RayTaskError as exc:  # the worker's own error (bad text): the same error here
            cause = exc.as_instanceof_cause()
            raise (cause if isinstance(cause, LlamaBatchError) else EngineClosed(first_line(exc))) from None
        except RayActorError as exc:
            raise EngineClosed(f"the Ray worker died: {death(exc)}") from None

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Receive the RequestRecord of every line's outcome (on the pool's thread). Returns unsubscribe."""
        return self.telemetry.subscribe(callback)

    def stats(self) -> EngineStats:
        with self._lock:
            live = [w for w in self._workers if w.state == READY]
            busy = sum(min(len(w.inflight), w.n_parallel) for w in live)
            n = sum(w.n_parallel for w in self._workers)
            waiting = self._dispatcher.waiting
            reserved = sum(w.reserved for w in self._workers)
        return self.telemetry.stats(["generating"] * busy + ["idle"] * (n - busy), waiting, self.slot_ctx,
                                    reserved_slots=reserved)

    def progress(self) -> str:
        """Per-worker rates for the progress line."""
        with self._lock:
            return ", ".join(w.tally.progress() for w in self._workers)

    def summary_lines(self) -> list[str]:
        with self._lock:
            d = self._dispatcher
            lines = [w.tally.summary() for w in self._workers]
            restarts = sum(w.tally.restarts for w in self._workers)
            lines.append(f"llamabatch run: Ray: {restarts} worker restart(s), {d.retries} line(s) retried"
                         + (f", {len(d.isolated)} line(s) failed as poison (engine_crashed)" if d.isolated else "")
                         + (f"; the cluster lost {d.pauses} time(s), {d.rerun} line(s) in flight then run again"
                            if d.pauses else ""))
        return lines

    @property
    def cluster(self) -> "RayPool":
        """What a job reads its workers from (job_opening: serve's lanes pass it on): the pool itself."""
        return self

    def worker_rows(self) -> list[dict[str, Any]]:
        """Each worker now, for serve's /health and /metrics."""
        with self._lock:
            return [worker_row(w) for w in self._workers]

    def describe(self) -> str:
        where = "a local Ray instance" if self._owns_ray else f"Ray cluster {self.address}"
        return header(self.model_name, self._workers, where)

    def close(self, timeout: float | None = None) -> None:
        """Stop the workers; every line without an outcome ends 'cancelled' (its worker is killed,
        not drained: `timeout` is not used). A Ray session this pool opened ends with it."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._watcher.stop()
        for w in self._workers:
            try:
                ray.kill(w.actor)
            except Exception:  # already dead: nothing to stop
                pass
        with self._lock:
            left = list(self._open.values())
        self._deliver([(line, cancelled_result()) for line in left])
        if self._ends_ray_session:
            ray.shutdown()  # a local instance we started goes away with it; a cluster is only left

    def kill(self) -> None:
        """Stop now: the workers are killed; lines without an outcome end 'cancelled'."""
        self.close(timeout=0)

    def _cancel(self, handle: RequestHandle) -> None:
        with self._lock:
            outcomes = self._dispatcher.cancel(handle.request_id)
        self._deliver(outcomes)

    def _deliver(self, outcomes: Outcomes) -> None:
        """Each line's one outcome: its text as one Delta, then its Result, and the telemetry.
        Never under self._lock: the callback takes run's own lock (see BatchRun._admit)."""
        for line, result in outcomes:
            with self._lock:
                if self._open.pop(line.key, None) is None:
                    continue  # it has its outcome already (close() raced an answer)
            result = dataclasses.replace(result, request_id=line.key)  # the worker's engine numbers its own
            if result.text or result.token_ids:
                line.handle._deliver(Delta(result.text, list(result.token_ids)))
            record_outcome(self.telemetry, result)
            line.handle._finish(result)
