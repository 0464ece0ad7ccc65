"""`run --ray`: one Engine per Ray actor, and a driver-side pool that run's batch loop uses
exactly as it uses an Engine (submit with a callback, cancel, stats, close).

This is the only module that imports ray, as runner.py is for llama_cpp. Import it lazily:
without Ray installed the import fails and the CLI prints how to install the extra.

Why Ray core actors and our own dispatcher rather than Ray Data with an actor pool: run
already has a streaming reader, a reorder-buffer writer, --resume and per-line errors. Ray
Data would own the read and the write (its own datasource/datasink, its own ordering and
retries), so run's one code path for records would become two. With actors the driver keeps
all of that and only the engine moves: each actor owns a continuous-batching engine and gets
single lines, a bounded number at a time (backpressure), so a slow line never holds a whole
block hostage and a dead worker costs exactly its in-flight lines, which we know by id.

Faults: an actor whose process dies is restarted in place by Ray (up to MAX_RESTARTS times);
its in-flight lines go back to the front of the queue and run on whichever worker is free.
A line that was in flight in several crashes is isolated and then answered with an error
record (the poison rule). A lost node's workers are gone; when every worker is gone the pool
stops with `fatal_error` set and the unanswered lines get no record, so --resume finishes them.
"""
from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .config import EngineConfig
from .engine import Engine, EngineStats
from .errors import LlamaBatchError
from .params import SamplingParams
from .ray_plan import Node, Placement, WorkerTally, place_workers
from .results import Result, Timings, Usage

log = logging.getLogger("llamabatch.ray")

MAX_RESTARTS = 4  # per worker and run: a worker that keeps dying (bad node, poison lines) is given up
RESTART_TIMEOUT_S = 300.0  # a worker not back by then (its node gone, no room) counts as gone
POLL_S = 0.05  # how long the dispatcher waits for results before looking at new lines


class RayStartError(LlamaBatchError):
    """Ray can't be reached, the cluster can't hold the engines, or a worker can't load the model."""

    code = "ray_start_error"


# -- the worker side: runs in a Ray actor process ------------------------------------------------

class EngineWorker:
    """One engine in a Ray actor. Lines come in as `generate` calls, several at a time (a
    threaded actor), and join the engine's running batch like any other submit."""

    def __init__(self, config: EngineConfig, default_params: SamplingParams):
        self._config = config
        self._defaults = default_params
        self._engine: Engine | None = None
        self._handles: dict[int, Any] = {}
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()

    def start(self) -> dict:
        """Load the model; report where we are and what we loaded (or why not)."""
        info = {"node": ray.util.get_node_ip_address(), "host": socket.gethostname(), "pid": os.getpid()}
        if self._engine is None:
            try:
                self._engine = Engine(self._config, default_params=self._defaults)
            except LlamaBatchError as exc:
                return {**info, "error": str(exc)}
        e = self._engine
        return {**info, "model_name": e.model_name, "slot_ctx": e.slot_ctx, "n_parallel": e.config.n_parallel,
                "threads": e.config.n_threads}

    def generate(self, key: int, prompt: Any, params: SamplingParams) -> Result:
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

    def pid(self) -> int:
        return os.getpid()


_RemoteWorker = ray.remote(EngineWorker)


# -- the driver side ----------------------------------------------------------------------------

def cancelled_result() -> Result:
    return Result(-1, "", [], "cancelled", Usage(), Timings())


def crashed_result(message: str) -> Result:
    return Result(-1, "", [], "error", Usage(), Timings(), error=message, error_code="engine_crashed")


class PoolHandle:
    """What `RayPool.submit` returns: enough of a RequestHandle for run's batch loop."""

    def __init__(self, pool: "RayPool", key: int):
        self._pool = pool
        self.request_id = key
        self.done = False

    def cancel(self) -> None:
        if not self.done:
            self._pool._cancel(self.request_id)


@dataclass
class _Line:
    key: int
    prompt: Any
    params: SamplingParams
    callback: Callable[[PoolHandle, Result], None] | None
    handle: PoolHandle
    crashes: int = 0  # workers that died while this line was in flight on them
    alone: bool = False  # run with nothing else on its worker (a crash suspect)
    worker: "_Worker | None" = None
    ref: Any = None
    cancel_asked: bool = False


class _Worker:
    def __init__(self, index: int, placement: Placement, actor: Any, cap: int):
        self.placement = placement
        self.actor = actor
        self.cap = cap  # most lines in flight on it: its slots plus as many queued in its engine
        self.state = "starting"  # starting -> ready -> restarting -> ready ... | gone
        self.start_ref: Any = None
        self.down_since = 0.0
        self.inflight: dict[int, _Line] = {}
        self.running_alone = False
        self.n_parallel = 0
        self.tally = WorkerTally(f"w{index}", placement.node.address, 0, placement.cpus)


class RayPool:
    """Engines on Ray workers behind one submit(). Build it with `RayPool.start(...)`."""

    def __init__(self, workers: list[_Worker], model_name: str, slot_ctx: int, owns_ray: bool, address: str):
        self.model_name = model_name
        self.slot_ctx = slot_ctx
        self.address = address  # "local" or what --ray was given
        self.fatal_error: str | None = None
        self._owns_ray = owns_ray
        self._workers = workers
        self._lock = threading.Lock()
        self._pending: collections.deque[_Line] = collections.deque()
        self._by_ref: dict[Any, _Line] = {}
        self._next_key = 0
        self._retries = 0
        self._isolated: list[int] = []
        self._submitted = self._finished = self._generated = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._dispatch_loop, name="llamabatch-ray", daemon=True)
        self._thread.start()

    # -- starting -------------------------------------------------------------------------------

    @classmethod
    def start(cls, config: EngineConfig, default_params: SamplingParams, *, address: str | None,
              workers: int | None, cpus_per_worker: int | None, gpus_per_worker: float,
              inflight_per_worker: int | None = None, log_to_driver: bool = False,
              note: Callable[[str], None] = lambda _m: None) -> "RayPool":
        """Connect to (or start) Ray, place the engines, load the model on every one.

        Raises RayStartError before any line runs: no cluster, no room, a node without the model.
        """
        owns = address is None
        if not log_to_driver:  # Ray's own warnings (token auth, ...) are not ours to show; --debug shows them
            logging.getLogger("ray").setLevel(logging.ERROR)
        try:
            if owns:
                ray.init(include_dashboard=False, log_to_driver=log_to_driver, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=log_to_driver, configure_logging=False)
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError ... by case
            hint = ""
            if not owns and not os.environ.get("RAY_AUTH_MODE"):
                hint = (" (a cluster started with token authentication, Ray's default, also needs "
                        "RAY_AUTH_MODE=token here and its token in ~/.ray/auth_token)")
            raise RayStartError(f"cannot {'start Ray' if owns else f'join the Ray cluster at {address}'}: "
                                f"{_first_line(exc)}{hint}") from None
        _raylet_messages_to_log()
        try:
            return cls._start_workers(config, default_params, owns, address or "local", workers, cpus_per_worker,
                                      gpus_per_worker, inflight_per_worker, note)
        except BaseException:
            ray.shutdown()
            raise

    @classmethod
    def _start_workers(cls, config: EngineConfig, default_params: SamplingParams, owns: bool, address: str,
                       workers: int | None, cpus: int | None, gpus: float, inflight: int | None,
                       note: Callable[[str], None]) -> "RayPool":
        from .ray_plan import PlacementError

        nodes = [Node(n["NodeID"], n["NodeManagerAddress"], int(n["Resources"].get("CPU", 0)),
                      float(n["Resources"].get("GPU", 0))) for n in ray.nodes() if n.get("Alive")]
        try:
            placements = place_workers(nodes, workers, cpus, gpus)
        except PlacementError as exc:
            raise RayStartError(str(exc)) from None
        cap = inflight or 2 * config.n_parallel
        if config.model is not None:  # the same absolute path on every node, not the driver's cwd
            config = config.replace(model=os.path.abspath(os.path.expanduser(config.model)))
        pool_workers = []
        for i, p in enumerate(placements, start=1):
            actor = _RemoteWorker.options(
                num_cpus=p.cpus, num_gpus=p.gpus or None, max_restarts=MAX_RESTARTS, max_task_retries=0,
                max_concurrency=cap + 4,  # room for cancel calls beside `cap` generate calls
                scheduling_strategy=NodeAffinitySchedulingStrategy(p.node.node_id, soft=False),
            ).remote(config.replace(threads=p.cpus), default_params)
            w = _Worker(i, p, actor, cap)
            w.start_ref = actor.start.remote()
            pool_workers.append(w)
        note(f"llamabatch run: Ray {'local instance' if owns else address}: {len(nodes)} node(s); starting "
             f"{len(placements)} engine(s) and loading the model on each")
        infos = _wait_all([w.start_ref for w in pool_workers], note)
        problems = []
        for w, info in zip(pool_workers, infos):
            if isinstance(info, BaseException):
                problems.append(f"node {w.placement.node.address}: worker {w.tally.name} did not start: "
                                f"{_first_line(info)}")
            elif "error" in info:
                problems.append(f"node {info['node']} ({info['host']}): {info['error']}")
            else:
                w.state, w.n_parallel, w.start_ref = "ready", info["n_parallel"], None
                w.tally.pid = info["pid"]
        if problems:
            raise RayStartError(problems[0] + (f" (and {len(problems) - 1} more worker(s))" if len(problems) > 1
                                               else ""))
        first = infos[0]
        pool = cls(pool_workers, first["model_name"], first["slot_ctx"], owns, address)
        for w in pool_workers:
            note(f"llamabatch run: {w.tally.name}: node {w.placement.node.address}, pid {w.tally.pid}, "
                 f"{w.placement.cpus} CPU(s) = threads" + (f", {w.placement.gpus:g} GPU(s)" if w.placement.gpus
                                                           else "") + f", {w.n_parallel} slots")
        return pool

    # -- what run's batch loop calls --------------------------------------------------------------

    @property
    def n_parallel(self) -> int:
        return sum(w.n_parallel for w in self._workers)

    @property
    def workers(self) -> int:
        return len(self._workers)

    @property
    def inflight_cap(self) -> int:
        """Lines the pool can take at once without queueing on the driver."""
        return sum(w.cap for w in self._workers)

    def submit(self, prompt: Any, params: SamplingParams | None = None, *, stream: bool = False,
               callback: Callable[[PoolHandle, Result], None] | None = None) -> PoolHandle:
        with self._lock:
            key = self._next_key
            self._next_key += 1
            line = _Line(key, prompt, params, callback, PoolHandle(self, key))
            self._submitted += 1
            if self.fatal_error is None and not self._closed.is_set():
                self._pending.append(line)
                self._dispatch()
                return line.handle
        self._deliver(line, cancelled_result())  # no worker left: no record, --resume runs it
        return line.handle

    def stats(self) -> EngineStats:
        with self._lock:
            busy = sum(min(len(w.inflight), w.n_parallel) for w in self._workers if w.state == "ready")
            n = self.n_parallel
            return EngineStats(slots_idle=n - busy, slots_prefilling=0, slots_generating=busy,
                               queue_depth=len(self._pending), n_parallel=n, slot_ctx=self.slot_ctx,
                               submitted=self._submitted, finished=self._finished, cancelled=0, failed=0,
                               timed_out=0, prompt_tokens=0, cached_tokens=0, generated_tokens=self._generated,
                               ticks=0, uptime_s=0.0)

    def progress(self) -> str:
        """Per-worker rates for the progress line."""
        with self._lock:
            return ", ".join(w.tally.progress() for w in self._workers)

    def summary_lines(self) -> list[str]:
        with self._lock:
            lines = [w.tally.summary() for w in self._workers]
            restarts = sum(w.tally.restarts for w in self._workers)
            lines.append(f"llamabatch run: Ray: {restarts} worker restart(s), {self._retries} line(s) retried"
                         + (f", isolated and failed: {self._isolated}" if self._isolated else ""))
        return lines

    def describe(self) -> str:
        where = "local Ray instance" if self._owns_ray else f"Ray cluster {self.address}"
        per = self._workers[0].n_parallel
        return (f"{self.model_name}, {len(self._workers)} engine(s) x {per} slots x {self.slot_ctx} tokens "
                f"on a {where}")

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        for w in self._workers:
            try:
                ray.kill(w.actor)
            except Exception:  # already dead: nothing to stop
                pass
        ray.shutdown()  # a local instance we started goes away with it; a cluster is only left

    # -- dispatching (under self._lock) -------------------------------------------------------------

    def _dispatch(self) -> None:
        """Hand queued lines to workers with room, least loaded first. A crash suspect waits for
        a worker of its own; the others keep flowing to the rest."""
        while self._pending:
            ready = [w for w in self._workers if w.state == "ready" and not w.running_alone]
            if not ready:
                return
            line = self._pending[0]
            if line.alone:
                idle = [w for w in ready if not w.inflight]
                if not idle:
                    # let the least busy worker drain; others keep taking ordinary lines
                    drain = min(ready, key=lambda w: len(w.inflight))
                    others = [l for l in self._pending if not l.alone]
                    rest = [w for w in ready if w is not drain and len(w.inflight) < w.cap]
                    while others and rest:
                        target = min(rest, key=lambda w: len(w.inflight))
                        self._pending.remove(others[0])
                        self._send(others.pop(0), target)
                        rest = [w for w in rest if len(w.inflight) < w.cap]
                    return
                self._pending.popleft()
                self._send(line, idle[0], alone=True)
                continue
            room = [w for w in ready if len(w.inflight) < w.cap]
            if not room:
                return
            self._pending.popleft()
            self._send(line, min(room, key=lambda w: len(w.inflight)))

    def _send(self, line: _Line, worker: _Worker, alone: bool = False) -> None:
        line.worker = worker
        line.ref = worker.actor.generate.remote(line.key, line.prompt, line.params)
        worker.inflight[line.key] = line
        worker.running_alone = alone
        worker.tally.inflight = len(worker.inflight)
        if line.crashes:
            worker.tally.retried_here += 1
        self._by_ref[line.ref] = line
        if line.cancel_asked:
            worker.actor.cancel.remote(line.key)

    def _cancel(self, key: int) -> None:
        with self._lock:
            line = next((l for l in self._pending if l.key == key), None)
            if line is not None:
                self._pending.remove(line)
            else:
                for w in self._workers:
                    if key in w.inflight:
                        w.inflight[key].cancel_asked = True
                        w.actor.cancel.remote(key)
                        return
                return
        self._deliver(line, cancelled_result())

    # -- the dispatcher thread ----------------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                late = self._give_up_late_restarts()
                refs = list(self._by_ref) + [w.start_ref for w in self._workers if w.start_ref is not None]
            for line, result in late:
                self._deliver(line, result)
            if not refs:
                time.sleep(POLL_S)
                continue
            try:
                ready, _ = ray.wait(refs, num_returns=1, timeout=POLL_S)
                if ready:
                    rest = [r for r in refs if r not in ready]
                    if rest:
                        more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                        ready += more
            except Exception:  # Ray shutting down under us (close): leave quietly
                if self._closed.is_set():
                    return
                log.exception("ray.wait failed")
                time.sleep(POLL_S)
                continue
            deliveries: list[tuple[_Line, Result]] = []
            for ref in ready:
                deliveries += self._collect(ref)
            for line, result in deliveries:
                self._deliver(line, result)

    def _collect(self, ref: Any) -> list[tuple[_Line, Result]]:
        """One finished call: a line's result, a worker's death, or a restarted worker back."""
        try:
            value = ray.get(ref, timeout=0)
            error: BaseException | None = None
        except RayActorError as exc:
            value, error = None, exc
        except RayTaskError as exc:  # a bug in the worker for this line: its record says so
            value, error = None, exc
        except GetTimeoutError:
            return []
        with self._lock:
            worker = next((w for w in self._workers if w.start_ref is not None and w.start_ref == ref), None)
            if worker is not None:
                return self._restarted(worker, value, error)
            line = self._by_ref.pop(ref, None)
            if line is None or line.worker is None:
                return []  # a call of a worker already counted as dead
            worker = line.worker
            if isinstance(error, RayActorError):
                return self._died(worker, error)
            del worker.inflight[line.key]
            worker.running_alone = False
            worker.tally.inflight = len(worker.inflight)
            if error is not None:
                result = crashed_result(f"the Ray worker failed on this line: {_first_line(error)}")
            else:
                result = value
                worker.tally.lines += 1
                worker.tally.generated += result.usage.completion_tokens
                self._generated += result.usage.completion_tokens
            self._finished += 1
            self._dispatch()
            return [(line, result)]

    def _died(self, worker: _Worker, error: BaseException) -> list[tuple[_Line, Result]]:
        """A worker's process or node is gone: retry its lines elsewhere, fail the poison ones."""
        lost = list(worker.inflight.values())
        worker.inflight.clear()
        worker.running_alone = False
        worker.tally.inflight = 0
        worker.tally.died_with += len(lost)
        worker.tally.death = _first_line(error)
        worker.tally.restarts += 1
        for line in lost:
            self._by_ref.pop(line.ref, None)
        out: list[tuple[_Line, Result]] = []
        retry: list[_Line] = []
        for line in sorted(lost, key=lambda l: l.key):
            line.worker = None
            if line.cancel_asked:  # Ctrl-C twice: no answer, --resume runs it
                out.append((line, cancelled_result()))
                continue
            line.crashes += 1
            verdict = self._poison_verdict(line)
            if verdict == "fail":
                self._isolated.append(line.key)
                self._finished += 1
                out.append((line, crashed_result(
                    f"a Ray worker died each of the {line.crashes} times this line ran "
                    f"(last: node {worker.placement.node.address}: {worker.tally.death})")))
            else:
                line.alone = verdict == "alone"
                retry.append(line)
        self._retries += len(retry)
        self._pending.extendleft(reversed(retry))  # retried lines first, in their order
        # Ray restarts the actor in place (max_restarts); `start` answers once it is back, or
        # raises if it can't come back (its node is gone, or its restarts are used up).
        worker.state = "restarting"
        worker.down_since = time.monotonic()
        worker.start_ref = worker.actor.start.remote()
        log.info("worker %s died (%s); %d line(s) retried", worker.tally.name, worker.tally.death, len(retry))
        self._dispatch()
        return out + self._check_all_gone()

    def _poison_verdict(self, line: _Line) -> str:
        # TODO(issue 18): the shared poison-line rule replaces this.
        if line.crashes >= 3:
            return "fail"
        return "alone" if line.crashes >= 2 else "retry"

    def _restarted(self, worker: _Worker, info: Any, error: BaseException | None) -> list[tuple[_Line, Result]]:
        worker.start_ref = None
        if error is None and "error" not in info:
            worker.state = "ready"
            worker.tally.pid = info["pid"]
            self._dispatch()
            return []
        worker.state = "gone"
        worker.tally.alive = False
        worker.tally.ended = time.monotonic()
        worker.tally.death = _first_line(error) if error is not None else info["error"]
        return self._check_all_gone()

    def _give_up_late_restarts(self) -> list[tuple[_Line, Result]]:
        now = time.monotonic()
        out: list[tuple[_Line, Result]] = []
        for w in self._workers:
            if w.state == "restarting" and now - w.down_since > RESTART_TIMEOUT_S:
                out += self._restarted(w, None, TimeoutError(f"not back {RESTART_TIMEOUT_S:.0f}s after it died"))
        return out

    def _check_all_gone(self) -> list[tuple[_Line, Result]]:
        if any(w.state != "gone" for w in self._workers) or self.fatal_error is not None:
            return []
        last = self._workers[-1].tally
        self.fatal_error = (f"every Ray worker is gone ({len(self._workers)} of {len(self._workers)}; "
                            f"last: {last.name} on {last.node}: {last.death})")
        out = [(line, cancelled_result()) for line in self._pending]
        self._pending.clear()
        return out

    def _deliver(self, line: _Line, result: Result) -> None:
        # Never under self._lock: the callback takes run's own lock (see BatchRun._admit).
        line.handle.done = True
        if line.callback is not None:
            try:
                line.callback(line.handle, result)
            except Exception:
                log.exception("callback for line %s failed", line.key)


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # Ray's errors carry tracebacks; the last "SomeError: message" line says what happened.
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and ("Error" in line.split(":")[0] or "Exception" in line.split(":")[0]):
            return line[:300]
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
