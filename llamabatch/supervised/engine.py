"""SupervisedEngine: the Engine API, with the engine and llama.cpp in a child process that is
restarted when it dies.

llama.cpp aborts the whole process on an assertion or a C++ throw, some reachable from
request data. Here that costs a restart, not the run:

- every request in flight in the dead child is retried in a fresh one, in quarantine groups
  decided by llamabatch/core/poison.py, so the request that causes the crash is found;
- that request ends with an `engine_crashed` error naming how the child died and llama.cpp's
  last log line; every other request finishes normally, each with exactly one Result;
- a child that dies while starting is retried a few times, then the engine stops with a
  ModelLoadError (first start) or `fatal_error` set and every request ended with
  `engine_unavailable` (a restart);
- a child with work in flight that makes no progress (no tick) for the watchdog's bound is
  killed and counts as a crash (watchdog.py), so a request that hangs it is isolated too;
- a crash before any child has finished a single step runs a built-in canary request first:
  when that crashes too, the engine, not the lines, is at fault (canary.py).

Every child is started by the supervisor thread, which lives as long as the engine: the
child's parent-death signal (child.py) is tied to the thread that started it.

Threads: callers submit and cancel under `_lock`, which is never held while writing to or
reading from a pipe (frames go out through the sender thread); the supervisor thread
(supervisor.py) reads the child's frames, delivers Deltas and Results, and restarts the child.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence as Seq

from ..config import EngineConfig
from ..core.handle import EventCallback, RequestHandle
from ..core.embedding import EmbedRequest
from ..core.inputs import Prompt
from ..errors import EngineClosed, LlamaBatchError
from ..params import SamplingParams, random_seed
from ..core.poison import MAX_CRASHES, PoisonRule
from ..core.engine_base import EngineBase, check_room, ended_result, error_result, record_outcome
from ..results import EmbeddingResult, Result
from ..core.telemetry import EngineStats, Telemetry
from . import wire
from .canary import CANARY_PARAMS, CANARY_PID, CANARY_PROMPT
from .child_process import ChildProcess
from .flight import Flight
# ENGINE_CRASHED, ENGINE_UNAVAILABLE and MAX_FRUITLESS_CRASHES are imported from here too
from .supervisor import ENGINE_CRASHED, ENGINE_UNAVAILABLE, MAX_FRUITLESS_CRASHES, Supervisor  # noqa: F401
from .watchdog import DEFAULT_FLOOR_S, DEFAULT_MARGIN, Watchdog

if TYPE_CHECKING:
    from ..in_process.runners import RunnerChoice
    from ..settings.resolved import Resolved

log = logging.getLogger("llamabatch.supervised")

CLOSE_WAIT_S = 30.0  # close() waits this long for the child to stop on its own, then kills it


class SupervisedEngine(EngineBase):
    """A continuous-batching engine whose llama.cpp runs in a supervised child process
    (llamabatch.api.EngineAPI).

    Same use as Engine: submit / stream / generate / cancel / stats / subscribe / close, as a
    context manager. `restarts` counts children started after a crash (`hangs`: how many of
    those crashes were the watchdog killing a hung child); `isolated` lists the
    request ids ended with `engine_crashed`; `fatal_error` is set when no child could be
    started again (every request then ends with `engine_unavailable`).
    """

    recovers_crashes = True

    def __init__(self, config: EngineConfig | None = None, *, default_params: SamplingParams | None = None,
                 max_crashes: int = MAX_CRASHES, env: dict[str, str] | None = None,
                 watchdog_s: float = DEFAULT_FLOOR_S, watchdog_margin: float = DEFAULT_MARGIN,
                 settings: "Resolved | None" = None, runner: "RunnerChoice | None" = None):
        """`watchdog_s`: the watchdog's floor in seconds (0 = no watchdog); a child with work in
        flight and no progress for max(watchdog_s, watchdog_margin x the longest recent tick)
        is killed as a crash. A restart's model load is bounded too (watchdog.load_bound).
        `settings`: resolved settings (the engine factory's, engines/factory.py), used as they
        are; without them `config` and `default_params` are resolved here, the way Engine does.
        `runner`: a registered runner the child runs instead of loading the model (tests)."""
        from ..settings.ready import check_model, settings_for

        resolved = settings if settings is not None else settings_for(config, default_params)
        if not resolved.model_checked:  # before any child starts; the child only ever sees the file
            check_model(resolved)
        self.config, self.default_params = resolved.engine, resolved.sampling
        self._model_name = self.config.model_name
        self.model_path = self.config.model
        self.slots_reason = resolved.slots_reason
        self._child_config = self.config.replace(model=self.model_path, max_queue=0)  # the parent bounds the queue
        # The child checks again before it allocates; checking here too means a setting that
        # cannot fit costs no child start and reaches the caller as itself (ResourceLimit).
        from ..kernel_paths import resources

        resources.check(self._child_config, self.model_path)
        self._env = env
        self._runner = runner
        self.telemetry = Telemetry()
        self.rule: PoisonRule[int] = PoisonRule(max_crashes=max_crashes)
        self.restarts = 0
        self.hangs = 0  # children the watchdog killed
        self.isolated: list[int] = []
        self.fatal_error = None
        self._lock = threading.RLock()
        self._flights: dict[int, Flight] = {}  # every request without an outcome
        self._in_child: dict[int, Flight] = {}  # those sent to the current child, in order
        self._held: list[int] = []  # fresh requests waiting for a child (restart, quarantine, hold())
        self._holding = 0
        self._next_id = 0
        self._closing = False
        self._slot_counts = (self.config.n_parallel, 0, 0, 0, 0)  # idle, prefilling, generating, child queue, KV cells
        self._calls: dict[int, list] = {}  # tokenize calls waiting: id -> [event, tokens, error]
        self._call_ids = itertools.count()
        self._chat_template = None
        # What the child's engine says once (Engine.on_notice): a logged warning unless set
        self.on_notice: Callable[[str], None] = lambda line: log.warning("%s", line)
        self._supervisor = Supervisor(self)
        self._watchdog = Watchdog(watchdog_s, watchdog_margin, busy=self._supervisor.busy,
                                  on_hang=self._supervisor.hung)
        self._canary: str | None = None  # None, "waiting" (to send) or "running": see canary.py
        self._child: ChildProcess | None = None
        self._starting: ChildProcess | None = None  # a child not ready yet (killed by close())
        self._outgoing: queue.SimpleQueue = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, name="llamabatch-supervised-send", daemon=True)
        self._sender.start()
        # The supervisor thread starts every child, the first one too (see the module docstring).
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._supervisor.run, name="llamabatch-supervisor", daemon=True)
        self._thread.start()
        try:
            self._started.wait()
        except BaseException:  # Ctrl-C or SIGTERM while the model loads: no child may stay behind
            self.close(timeout=0)
            raise
        if self._start_error is not None:
            self._outgoing.put(None)
            raise self._start_error
        info = self._child.info
        self.slot_ctx = info.slot_ctx
        self.n_slots = info.n_slots
        self.kernels = info.kernels  # which CPU kernels the child's llama.cpp runs, and why
        self.slots_reason = self.slots_reason or info.slots_reason  # the child's, when it chose "auto" itself
        self._slot_counts = (self.n_slots, 0, 0, 0, 0)
        self._watchdog.start()

    # -- the engine API (llamabatch.api.EngineAPI; generate and the context manager: engine_base.py)

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def chat_template(self):
        if self._chat_template is None:
            from ..models.chat_template import from_gguf

            info = self._child.info if self._child is not None else None
            meta = info.metadata if info is not None else {}
            self._chat_template = from_gguf(meta.get("tokenizer.chat_template"), meta,
                                            bos_token=info.bos_text if info is not None else "",
                                            eos_token=info.eos_text if info is not None else "",
                                            choice=self.config.chat_template)
        return self._chat_template

    def render_chat(self, messages: Seq[dict]) -> str:
        from ..models.chat_template import validate_messages

        return self.chat_template.render(validate_messages(messages), add_generation_prompt=True)

    def tokenize(self, text: str, *, special: bool = False, add_special: bool = True,
                 timeout: float = 60.0) -> list[int]:
        """Tokenize in the child (the model lives there). Raises EngineClosed if it dies meanwhile."""
        return self._ask_child(lambda call_id: wire.Tokenize(call_id, text, special, add_special), "tokenize",
                               timeout)

    def token_pieces(self, tokens: Seq[int], *, timeout: float = 60.0) -> list[bytes]:
        """Each token's text, from the child (its vocabulary); InvalidRequest for an id it lacks."""
        return self._ask_child(lambda call_id: wire.TokenPieces(call_id, list(tokens)), "token_pieces", timeout)

    @property
    def ready(self) -> bool:
        # no lock: a health probe must not wait behind a caller holding it
        return self._child is not None and not self._closing and self.fatal_error is None

    def _ask_child(self, frame: Callable[[int], Any], what: str, timeout: float) -> Any:
        """Send the child the frame `frame(call_id)` makes and wait for its Tokenized reply."""
        call = [threading.Event(), None, None]
        with self._lock:
            if self._closing or self._child is None:
                raise EngineClosed("the engine is closed" if self._closing else "the engine process is restarting")
            call_id = next(self._call_ids)
            self._calls[call_id] = call
            self._outgoing.put((self._child, frame(call_id)))
        if not call[0].wait(timeout):
            with self._lock:
                self._calls.pop(call_id, None)
            raise TimeoutError(f"{what} took more than {timeout}s")
        if call[2] is not None:
            raise call[2]
        return call[1]

    def submit(self, prompt: Prompt, params: SamplingParams | None = None, *, stream: bool = True,
               callback: EventCallback | None = None) -> RequestHandle:
        """Queue one request (see Engine.submit). Prompt errors found in the child end the
        handle with finish_reason 'error' a moment later instead of at once."""
        handle = self._new_handle(stream, callback)

        def checked() -> SamplingParams:
            checked = (params or self.default_params).validate()
            if checked.seed is None:  # fixed here, so a retry in a new child samples the same way
                checked = checked.replace(seed=self.config.seed if self.config.seed is not None else random_seed())
            return checked
        return self._admit(handle, prompt, checked)

    def _submit_embed(self, request: EmbedRequest, callback: EventCallback | None) -> RequestHandle:
        """Queue one embeddings request (engine_base.py's submit_embedding): it travels to the child
        as the request's prompt and is retried after a crash like any other request; its
        timeout rides in the params, so a retry gets what is left of it."""
        handle = self._new_handle(False, callback)
        handle.kind = "embed"
        return self._admit(handle, request,
                           lambda: self.default_params.replace(timeout=request.timeout, seed=0).validate())

    def _new_handle(self, stream: bool, callback: EventCallback | None) -> RequestHandle:
        if self._closing:
            raise EngineClosed("the engine is closed")
        if self.fatal_error is not None:
            raise EngineClosed(self.fatal_error)
        with self._lock:
            pid = self._next_id
            self._next_id += 1
        return RequestHandle(self._cancel, pid, stream, callback)

    def _admit(self, handle: RequestHandle, payload: Any, params: Callable[[], SamplingParams]) -> RequestHandle:
        """A generation or embeddings request into the queue for the child; bad input (what
        `params` raises) is a request too: it gets its Result at once, as in Engine."""
        try:
            checked = params()
        except LlamaBatchError as exc:
            with self._lock:
                self.telemetry.totals.submitted += 1
            self._finish(None, handle, error_result(handle.request_id, str(exc), exc.code))
            return handle
        flight = Flight(handle, payload, checked, time.perf_counter())
        with self._lock:
            if self._closing or self.fatal_error is not None:
                raise EngineClosed(self.fatal_error or "the engine is closed")
            check_room(len(self._flights), self.n_slots, self.config.max_queue)
            # counted only once accepted: a refused request (QueueFull, EngineClosed) never entered
            self.telemetry.totals.submitted += 1
            self._flights[handle.request_id] = flight
            self._held.append(handle.request_id)
            self._dispatch()
        return handle

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Requests submitted inside reach the child in one frame and start in the same tick."""
        with self._lock:
            self._holding += 1
        try:
            yield
        finally:
            with self._lock:
                self._holding -= 1
                self._dispatch()

    def stats(self) -> EngineStats:
        idle, prefilling, generating, child_queue, kv_cells = self._slot_counts  # as of the child's last tick
        with self._lock:
            outside = len(self._flights) - len(self._in_child)  # held here: restart, quarantine, hold()
        states = ["idle"] * idle + ["prefilling"] * prefilling + ["generating"] * generating
        return self.telemetry.stats(states, child_queue + outside, self.slot_ctx, self.config.reserved_slots,
                                    kv_cells)

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Receive every TickRecord and RequestRecord (on the supervisor thread). Returns unsubscribe."""
        return self.telemetry.subscribe(callback)

    def close(self, timeout: float | None = None) -> None:
        """Cancel what is in flight (each gets its Result), stop the child, stop the threads.

        `timeout`: seconds the child gets to stop on its own (default CLOSE_WAIT_S); then it is
        killed, and every request still without an outcome ends "cancelled". 0 kills at once."""
        wait = CLOSE_WAIT_S if timeout is None else max(0.0, timeout)
        with self._lock:
            already = self._closing
            self._closing = True
            child, starting = self._child, self._starting
        if starting is not None:  # a (re)start in progress: nothing to wait for
            starting.kill("killed: the engine was closed while it started")
        if not already and child is not None:
            self._outgoing.put((child, wire.Close()))
        if threading.current_thread() is not self._thread:
            self._thread.join(wait)
            if self._thread.is_alive():
                child = self._child
                if child is not None:
                    if wait:
                        log.warning("the engine process did not stop in %gs; killing it", wait)
                    child.kill(f"killed: it did not stop within {wait:g}s of close")
                self._thread.join()
        self._watchdog.stop()
        self._outgoing.put(None)

    def kill(self) -> None:
        """Stop now (a bounded shutdown's last step): the child is killed, and every request
        without an outcome ends "cancelled"."""
        self.close(timeout=0)

    # -- caller side -----------------------------------------------------------------------------

    def _cancel(self, handle: RequestHandle) -> None:
        with self._lock:
            flight = self._flights.get(handle.request_id)
            if flight is None:
                return
            flight.cancel_requested = True
            if flight.pid in self._in_child:
                self._outgoing.put((self._child, wire.Cancel(flight.pid)))
                return
            # held here (waiting for a child or for its quarantine group): it ends now
            self._forget(flight)
            self._dispatch()
        self._finish(flight, handle, ended_result(flight.pid, "cancelled", seed=flight.params.seed))

    def _dispatch(self) -> None:
        """Send what may go to the child now (under _lock). During quarantine only one suspect
        group is in the child, alone; fresh requests wait until the quarantine is over."""
        if self._child is None or self._holding or self._closing:
            return
        if self._canary is not None:  # the canary runs alone, before anything else
            if self._canary == "waiting" and not self._in_child:
                self._canary = "running"
                self._watchdog.progress()  # the stall clock starts with the work
                self._outgoing.put((self._child, wire.Submit([wire.Request(CANARY_PID, CANARY_PROMPT, CANARY_PARAMS)])))
            return
        if self.rule.quarantining:
            if self._in_child:
                return
            group = self.rule.next_group()
            if group:
                self._send([self._flights[pid] for pid in group])
                return
        if self._held:
            held, self._held = self._held, []
            self._send([self._flights[pid] for pid in held])

    def _send(self, flights: list[Flight]) -> None:
        if not self._in_child:
            self._watchdog.progress()  # the stall clock starts with the work, not at the last frame
        batch = []
        for flight in flights:
            params = flight.params
            if params.timeout is not None:  # a retry gets what is left of the request's time
                left = params.timeout - (time.perf_counter() - flight.submitted_at)
                params = params.replace(timeout=max(left, 1e-3))
            flight.new_attempt()
            self._in_child[flight.pid] = flight
            batch.append(wire.Request(flight.pid, flight.prompt, params))
        self._outgoing.put((self._child, wire.Submit(batch)))

    def _send_loop(self) -> None:
        # The only writer of child stdin: a full pipe never blocks a caller holding _lock.
        while True:
            item = self._outgoing.get()
            if item is None:
                return
            child, message = item
            if child is not None:
                child.send(message)

    def _forget(self, flight: Flight) -> None:
        self._flights.pop(flight.pid, None)
        self._in_child.pop(flight.pid, None)
        if flight.pid in self._held:
            self._held.remove(flight.pid)
        self.rule.finished(flight.pid)

    def _finish(self, flight: Flight | None, handle: RequestHandle, result: Result) -> None:
        """The one terminal outcome of a request (never under _lock: it calls the caller back)."""
        if handle.kind == "embed":  # ended here (cancelled, crashed, unavailable): no vectors
            result = EmbeddingResult.ended(result)
        record_outcome(self.telemetry, result)
        handle._finish(result)

