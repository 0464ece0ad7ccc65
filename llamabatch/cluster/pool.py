"""`run --ray`: one Engine per Ray actor, and a driver-side pool with the engine API
(llamabatch.api.EngineAPI): run's batch loop uses it exactly as it uses an Engine.

This is the only module that imports ray, as llama/ is for llama_cpp. Import it lazily:
without Ray installed the import fails and the CLI prints how to install the extra.
What runs where is decided in dispatch.py (pure); this module is the Ray side: starting
or joining Ray, placing and starting the actors, the calls, and watching them finish.

Why Ray core actors and our own dispatcher rather than Ray Data with an actor pool: run
already has a streaming reader, a reorder-buffer writer, --resume and per-line errors. Ray
Data would own the read and the write (its own datasource/datasink, its own ordering and
retries), so run's one code path for records would become two. With actors only the engine
moves: each actor owns a continuous-batching engine and gets single lines, a bounded number
at a time, so a slow line never holds a block back and a dead worker costs exactly its
in-flight lines, which the driver knows by id.

Faults: an actor whose process dies is restarted in place by Ray (up to MAX_RESTARTS times)
and its in-flight lines are retried under the shared poison-line rule. A worker with lines in
flight whose engine finishes no step for the watchdog's bound (llamabatch/supervised/
watchdog.py: max(floor, margin x its longest recent step); a stopped process does not even
answer) is killed and handled the same way. A worker that can't
come back (its node is gone) is gone; when every worker is gone the pool sets `fatal_error`
and the unanswered lines get no record, so --resume finishes them.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..config import EngineConfig
from ..core.engine import EngineCore, EngineStats
from ..core.handle import EventCallback, RequestHandle
from ..core.engine_base import EngineBase, check_room, record_outcome
from ..core.telemetry import Telemetry
from ..errors import ClusterStartError, EngineClosed, LlamaBatchError
from ..in_process.runners import RunnerChoice
from ..params import SamplingParams
from ..settings.slots import most_slots
from .describe import header, slots_note
from .dispatch import READY, RESTARTING, Dispatcher, Line, Outcomes, WorkerState, cancelled_result, crashed_result
from .plan import Node, PlacementError, WorkerTally, place_workers
from ..results import Delta, Result
from ..supervised.watchdog import DEFAULT_FLOOR_S, DEFAULT_MARGIN, RECENT_TICKS, Watchdog
from ..core.telemetry import TickRecord

log = logging.getLogger("llamabatch.ray")

MAX_RESTARTS = 4  # per worker and run: a worker that keeps dying (bad node, poison lines) is given up
RESTART_TIMEOUT_S = 300.0  # a worker not back by then (its node gone, no room) counts as gone
POLL_S = 0.05  # how long the watcher waits for results before looking again
PROGRESS_EVERY_S = 1.0  # how often the watcher asks a busy worker how many steps its engine finished


class RayStartError(ClusterStartError):
    """Ray can't be reached, the cluster can't hold the engines, or a worker can't load the model."""

    code = "ray_start_error"


# -- the worker side: runs in a Ray actor process ------------------------------------------------

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


_RemoteWorker = ray.remote(EngineWorker)


# -- the driver side ----------------------------------------------------------------------------

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
                 default_params: SamplingParams | None = None):
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
        self._by_ref: dict[Any, Line] = {}
        self._open: dict[int, Line] = {}  # every line without its outcome
        self._dispatcher = Dispatcher(workers, self._send, self._cancel_remote)
        self._next_key = 0
        self._hangs = 0
        self.telemetry = Telemetry()
        self._closing = False
        self._closed = threading.Event()
        self._here = ray.util.get_node_ip_address()  # a hung worker on this node is also SIGKILLed by pid
        for w in workers:
            w.watchdog = Watchdog(watchdog_s, DEFAULT_MARGIN, busy=lambda w=w: len(w.inflight) if w.state == READY else 0,
                                  on_hang=lambda reason, w=w: self._kill_hung(w, reason))
        self._thread = threading.Thread(target=self._watch, name="llamabatch-ray", daemon=True)
        self._thread.start()

    # -- starting -------------------------------------------------------------------------------

    @classmethod
    def start(cls, config: EngineConfig, default_params: SamplingParams, *, address: str | None,
              workers: int | None, cpus_per_worker: int | None, gpus_per_worker: float,
              inflight_per_worker: int | None = None, log_to_driver: bool = False,
              note: Callable[[str], None] = lambda _m: None, max_slots: int | None = None,
              watchdog_s: float = DEFAULT_FLOOR_S, runner: RunnerChoice | None = None) -> "RayPool":
        """Connect to (or start) Ray, place the engines, load the model on every one.

        Raises RayStartError before any line runs: no cluster, no room, a node without the model.
        """
        owns = address is None
        joined = ray.is_initialized()  # a session the caller opened: used as it is, and left open
        if not log_to_driver:  # Ray's own warnings (token auth, ...) are not ours to show; --debug shows them
            logging.getLogger("ray").setLevel(logging.ERROR)
        try:
            if not joined and owns:
                ray.init(include_dashboard=False, log_to_driver=log_to_driver, configure_logging=False)
            elif not joined:
                ray.init(address=address, log_to_driver=log_to_driver, configure_logging=False)
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError ... by case
            hint = ""
            if not owns and not os.environ.get("RAY_AUTH_MODE"):
                hint = (" (a cluster with token authentication also needs RAY_AUTH_MODE=token here and "
                        "its token in ~/.ray/auth_token)")
            raise RayStartError(f"cannot {'start Ray' if owns else f'join the Ray cluster at {address}'}: "
                                f"{_first_line(exc)}{hint}") from None
        _raylet_messages_to_log()
        try:
            pool = cls._start_workers(config, default_params, owns, address or "local", workers, cpus_per_worker,
                                      gpus_per_worker, inflight_per_worker, note, max_slots, watchdog_s, runner)
        except BaseException:
            if not joined:
                ray.shutdown()
            raise
        pool._ends_ray_session = not joined
        return pool

    @classmethod
    def _start_workers(cls, config: EngineConfig, default_params: SamplingParams, owns: bool, address: str,
                       workers: int | None, cpus: int | None, gpus: float, inflight: int | None,
                       note: Callable[[str], None], max_slots: int | None = None,
                       watchdog_s: float = DEFAULT_FLOOR_S, runner: RunnerChoice | None = None) -> "RayPool":
        nodes = [Node(n["NodeID"], n["NodeManagerAddress"], int(n["Resources"].get("CPU", 0)),
                      float(n["Resources"].get("GPU", 0))) for n in ray.nodes() if n.get("Alive")]
        try:
            placements = place_workers(nodes, workers, cpus, gpus)
        except PlacementError as exc:
            raise RayStartError(str(exc)) from None
        # With "auto" each worker chooses its slot count when it starts; until then plan for the
        # most it may choose (the actor's thread count is fixed when it is created).
        most = most_slots(config)
        cap = inflight or 2 * most
        if config.model is not None:  # the same absolute path on every node, not the driver's cwd
            config = config.replace(model=os.path.abspath(os.path.expanduser(config.model)))
        pool_config = config
        config = config.replace(max_queue=0)  # the pool bounds the queue, for all workers at once
        states = []
        for i, p in enumerate(placements, start=1):
            actor = _RemoteWorker.options(
                num_cpus=p.cpus, num_gpus=p.gpus, max_restarts=MAX_RESTARTS, max_task_retries=0,
                max_concurrency=cap + 4,  # room for cancel calls beside `cap` generate calls
                scheduling_strategy=NodeAffinitySchedulingStrategy(p.node.node_id, soft=False),
            ).remote(config.replace(threads=p.cpus), default_params, max_slots, runner)
            w = WorkerState(WorkerTally(f"w{i}", p.node.address, 0, p.cpus), cap, most,
                            actor=actor, start_ref=actor.start.remote())
            states.append(w)
        note(f"llamabatch run: Ray {'local instance' if owns else address}: {len(nodes)} node(s); starting "
             f"{len(placements)} engine(s) and loading the model on each")
        infos = _wait_all([w.start_ref for w in states], note)
        problems = []
        for w, p, info in zip(states, placements, infos):
            w.start_ref = None
            if isinstance(info, BaseException):
                problems.append(f"node {p.node.address}: worker {w.tally.name} did not start: {_first_line(info)}")
            elif "error" in info:
                problems.append(f"node {info['node']} ({info['host']}): {info['error']}")
            else:
                w.n_parallel, w.tally.pid = info["n_parallel"], info["pid"]
                w.slot_ctx, w.slots_reason = info["slot_ctx"], info.get("slots_reason", "")
                w.cap = inflight or 2 * w.n_parallel  # its engine's own slots now that it has chosen
        if problems:
            more = f" (and {len(problems) - 1} more worker(s))" if len(problems) > 1 else ""
            raise RayStartError(problems[0] + more)
        for w, p in zip(states, placements):
            w.tally.started = time.monotonic()
            note(f"llamabatch run: {w.tally.name}: node {p.node.address}, pid {w.tally.pid}, {p.cpus} CPU(s) = "
                 f"threads" + (f", {p.gpus:g} GPU(s)" if p.gpus else "") + f", {slots_note(w)}")
        # slot_ctx: the smallest, for stats (with auto and a total n_ctx, workers differ)
        return cls(states, infos[0]["model_name"], min(w.slot_ctx for w in states), owns, address, watchdog_s,
                   pool_config, default_params)

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
        return self._hangs

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
        with self._lock:
            if self._closing:
                raise EngineClosed("the engine is closed")
            check_room(len(self._open), sum(w.n_parallel for w in self._workers), self.config.max_queue)
            key = self._next_key
            self._next_key += 1
            self.telemetry.totals.submitted += 1
            line = Line(key, prompt, params, handle=RequestHandle(self._cancel, key, stream, callback))
            self._open[key] = line
            outcomes = self._dispatcher.submit(line)
        self._deliver(outcomes)
        return line.handle

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
            raise (cause if isinstance(cause, LlamaBatchError) else EngineClosed(_first_line(exc))) from None
        except RayActorError as exc:
            raise EngineClosed(f"the Ray worker died: {_death(exc)}") from None

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Receive the RequestRecord of every line's outcome (on the pool's thread). Returns unsubscribe."""
        return self.telemetry.subscribe(callback)

    def stats(self) -> EngineStats:
        with self._lock:
            live = [w for w in self._workers if w.state == READY]
            busy = sum(min(len(w.inflight), w.n_parallel) for w in live)
            n = sum(w.n_parallel for w in self._workers)
            waiting = self._dispatcher.waiting
        return self.telemetry.stats(["generating"] * busy + ["idle"] * (n - busy), waiting, self.slot_ctx)

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
                         + (f", {len(d.isolated)} line(s) failed as poison (engine_crashed)" if d.isolated else ""))
        return lines

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
        self._closed.set()
        self._thread.join()
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

    # -- Ray calls (the dispatcher calls these under self._lock) -------------------------------------

    def _send(self, line: Line, worker: WorkerState) -> None:
        if len(worker.inflight) == 1 and worker.watchdog is not None:  # it was idle: the stall clock starts now
            worker.watchdog.progress()
        line.ref = worker.actor.generate.remote(line.key, line.prompt, line.params)
        self._by_ref[line.ref] = line

    def _cancel_remote(self, line: Line) -> None:
        if line.worker is not None:
            line.worker.actor.cancel.remote(line.key)

    def _cancel(self, handle: RequestHandle) -> None:
        with self._lock:
            outcomes = self._dispatcher.cancel(handle.request_id)
        self._deliver(outcomes)

    # -- the watcher thread: results, deaths, restarts -----------------------------------------------

    def _watch(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                outcomes = self._restarts()
                self._watchdogs()
                refs = (list(self._by_ref) + [w.start_ref for w in self._workers if w.start_ref is not None]
                        + [w.progress_ref for w in self._workers if w.progress_ref is not None])
            self._deliver(outcomes)
            if not refs:
                time.sleep(POLL_S)
                continue
            try:
                ready, rest = ray.wait(refs, num_returns=1, timeout=POLL_S)
                if ready and rest:
                    more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                    ready += more
            except Exception:
                if self._closed.is_set():  # Ray shutting down under us
                    return
                log.exception("ray.wait failed")
                time.sleep(POLL_S)
                continue
            for ref in ready:
                self._deliver(self._collect(ref))

    def _collect(self, ref: Any) -> Outcomes:
        """One finished call: a line's answer, a worker's death, or a restarted worker back."""
        error: BaseException | None = None
        value: Any = None
        try:
            value = ray.get(ref, timeout=0)
        except (RayActorError, RayTaskError) as exc:
            error = exc
        except GetTimeoutError:
            return []
        with self._lock:
            d = self._dispatcher
            worker = next((w for w in self._workers if w.progress_ref is not None and w.progress_ref == ref), None)
            if worker is not None:  # a watchdog question answered (a dead worker's is told by its lines)
                worker.progress_ref = None
                if error is None and worker.watchdog is not None and value[0] != worker.steps_seen:
                    worker.steps_seen = value[0]
                    worker.watchdog.progress([value[1]])
                return []
            worker = next((w for w in self._workers if w.start_ref is not None and w.start_ref == ref), None)
            if worker is not None:  # `start` after a death: back, or not coming back
                worker.start_ref = None
                if error is None and "error" not in value:
                    return d.back(worker, value["pid"])
                if isinstance(error, ActorUnavailableError):  # still restarting: ask again shortly
                    worker.ask_again_at = time.monotonic() + 0.5
                    return []
                return d.gone(worker, _first_line(error) if error is not None else value["error"])
            line = self._by_ref.pop(ref, None)
            if line is None or line.worker is None:
                return []  # a call of a worker already counted as dead
            worker = line.worker
            if isinstance(error, RayActorError):
                for lost in worker.inflight.values():
                    self._by_ref.pop(lost.ref, None)
                outcomes = d.died(worker, worker.kill_reason or _death(error))
                worker.kill_reason = None
                worker.progress_ref = None
                worker.steps_seen = -1  # a restarted engine counts from 0
                # Ray restarts the actor in place; `start` answers once it is back, or raises
                # if it can't come back (its node is gone, or its restarts are used up).
                worker.down_since = worker.ask_again_at = time.monotonic()
                log.info("worker %s died: %s", worker.tally.name, worker.tally.death)
                return outcomes
            result = value if error is None else crashed_result(
                f"the Ray worker failed on this line: {_first_line(error)}")
            return d.answered(line, result)

    def _watchdogs(self) -> None:
        """Ask busy workers how many steps they finished (at most one question out per worker), and
        let each watchdog judge: a stopped worker never answers, so its clock runs out too."""
        now = time.monotonic()
        for w in self._workers:
            if w.watchdog is None or not w.watchdog.enabled or w.state != READY or not w.inflight:
                continue
            if w.progress_ref is None and now >= w.ask_progress_at:
                w.progress_ref = w.actor.progress.remote()
                w.ask_progress_at = now + PROGRESS_EVERY_S
            w.watchdog.check()

    def _kill_hung(self, worker: WorkerState, reason: str) -> None:
        """The watchdog fired (under self._lock): kill the actor's process. Its lines then fail with
        RayActorError and are retried as for any dead worker; Ray restarts it in place."""
        worker.kill_reason = reason
        self._hangs += 1
        log.warning("worker %s is hung; %s", worker.tally.name, reason)
        if worker.tally.node == self._here and worker.tally.pid:
            try:  # certain, also for a stopped process; ray.kill below tells Ray
                os.kill(worker.tally.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            ray.kill(worker.actor, no_restart=False)
        except Exception:  # already dead: its lines' errors say so
            pass

    def _restarts(self) -> Outcomes:
        """Ask restarting workers whether they are back; give up on those that take too long."""
        now = time.monotonic()
        out: Outcomes = []
        for w in self._workers:
            if w.state != RESTARTING:
                continue
            if now - w.down_since > RESTART_TIMEOUT_S:
                w.start_ref = None
                out += self._dispatcher.gone(w, f"not back {RESTART_TIMEOUT_S:.0f}s after it died")
            elif w.start_ref is None and now >= w.ask_again_at:
                w.start_ref = w.actor.start.remote()
        return out

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


def _raylet_messages_to_log() -> None:
    """Ray prints the raylet's error messages ("A worker died or was killed ...", a paragraph
    each) to the driver's stdout, where run's data may go. Our own one-line notes and the
    summary say what happened; send Ray's text to the log instead (shown with --debug)."""
    import ray._private.worker as ray_worker  # private: if it moves, Ray's own printing stays

    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None or getattr(original, "_llamabatch", False):
        return

    def print_to_log(data: dict, ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            for line in data.get("lines", []):
                log.info("raylet: %s", line)
        else:
            original(data, ignore_prefix)

    print_to_log._llamabatch = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = print_to_log


def _wait_all(refs: list, note: Callable[[str], None]) -> list:
    """Every start() answer (or its exception), in order; a note every 15 s while models load."""
    results: dict[int, Any] = {}
    waiting = dict(enumerate(refs))
    last_note = time.monotonic()
    while waiting:
        ready, _ = ray.wait(list(waiting.values()), num_returns=len(waiting), timeout=1.0)
        for i, ref in list(waiting.items()):
            if ref in ready:
                try:
                    results[i] = ray.get(ref)
                except Exception as exc:
                    results[i] = exc
                del waiting[i]
        if waiting and time.monotonic() - last_note > 15:
            last_note = time.monotonic()
            note(f"llamabatch run: waiting for {len(waiting)} engine(s) to start (placing and loading the model)")
    return [results[i] for i in range(len(refs))]


def _death(exc: BaseException) -> str:
    """Why a worker's call failed, short: Ray's own text is a paragraph with ids."""
    if isinstance(exc, ActorUnavailableError):
        return "its process died or can't be reached (ActorUnavailableError)"
    return _first_line(exc)[:200]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # Ray's errors carry tracebacks; the last "SomeError: message" line says what happened.
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and ("Error" in line.split(":")[0] or "Exception" in line.split(":")[0]):
            return line[:300]
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
