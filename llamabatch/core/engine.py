"""EngineCore: one background thread owns the llama context and runs the tick loop.

Callers submit from any thread and get a RequestHandle that streams Deltas and ends with
exactly one Result (finish_reason stop, length, cancelled, error or timeout).

Who does what: `inputs.InputPreparer` turns a prompt into a Sequence (caller's thread);
each kind of work is a lane (lanes/work_lane.py): lanes/generation_lane.py runs the
`Scheduler`'s plans, lanes/embedding_lane.py the embeddings batches, and OpenRequests
(lanes/open_requests.py) gives each request its one Result. What is left here is the
thread, the hand-over between callers and that thread, and the tick that calls every lane
the same way.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from typing import Any, Callable, Iterator, Sequence as Seq

from .sampling_threads import SamplingThreads, wants_apart
from .embedding import EmbedRequest, prepare_job
from .lanes.embedding_lane import EmbeddingLane
from ..checks.cpus import usable_cpus
from ..config import EngineConfig
from ..errors import EngineClosed, InternalError, LlamaBatchError, QueueFull
from .lanes.generation_lane import GenerationLane
from .handle import EventCallback, RequestHandle
from .inputs import ChatTemplates, InputPreparer, Prompt
from ..params import SamplingParams
from .plan import Runner
from .prefixes.disk_prefix import DiskPrefixes
from .lanes.open_requests import OpenRequests
from .scheduling.scheduler import Scheduler
from .sequence import Sequence
from .engine_base import EngineBase, check_room, checked_token_ids
from .speculation import Speculation
from .telemetry import EngineStats, Telemetry
from .tick_interrupt import TickInterrupt
from .lanes.work_lane import WorkLane

log = logging.getLogger("llamabatch.engine")

# Callers that hold an engine import the types of its API from here.
__all__ = ["EngineCore", "EngineStats", "RequestHandle", "Prompt", "EventCallback"]


def free_samplers(runner: Runner, seq: Sequence) -> None:
    """Free the chains of a request that was prepared but never queued."""
    for member in seq.members:
        runner.free_sampler(member.sampler)
        member.sampler = None


def park_budget(runner: Runner) -> int:
    """Bytes of preempted requests' KV kept in memory at once: the KV cache's own size (what the
    memory checks counted once), 1 GiB where the runner does not know it."""
    kv_mib = runner.capabilities.kv_mib
    return int(kv_mib * 2**20) if kv_mib is not None and kv_mib > 0 else 1 << 30


class EngineCore(EngineBase):
    """The continuous-batching engine over a runner it is given (llamabatch.api.EngineAPI): the
    tick loop and its thread. `llamabatch.Engine` (in_process/engine.py) is this class with the
    model loaded and what lives in higher layers handed in; use that one."""

    def __init__(self, config: EngineConfig | None = None, *, runner: Any,
                 default_params: SamplingParams | None = None,
                 on_notice: Callable[[str], None] | None = None, slots_reason: str = "",
                 chat_templates: ChatTemplates | None = None,
                 open_disk: Callable[[EngineConfig, Any], DiskPrefixes | None] | None = None):
        """An engine over `runner` (loaded, with its slots) with `config`, whose settings are
        decided already: the model and n_parallel are the runner's. What comes from the layers
        above is handed in: `chat_templates` (None: chat messages are refused), `open_disk` (opens
        the disk prefix store for the checked config and this runner, or gives None; None: no store). llamabatch.engines builds engines
        this way; `llamabatch.Engine(EngineConfig(...))` is that builder's class."""
        self.config = (config or EngineConfig()).validate()
        if self.config.n_parallel == "auto":
            raise ValueError('n_parallel "auto" is decided before an engine starts (llamabatch.engines)')
        params = (default_params or SamplingParams()).validate()
        self.slots_reason = slots_reason  # why this many slots, when n_parallel="auto" chose them
        self.model_path = runner.model_path
        self._model_name = self.config.model_name or self.model_path
        self.runner = runner
        self.kernels = runner.kernel_text  # for the header line: which CPU kernels run, and why
        self.slot_ctx = runner.slot_ctx
        can = runner.capabilities
        self.inputs = InputPreparer(runner, runner.slot_ctx, params, default_seed=self.config.seed,
                                    chat_template=self.config.chat_template, chat_templates=chat_templates,
                                    on_notice=on_notice or (lambda line: log.warning("%s", line)))
        # Prefix sharing across slots forks KV between slots: only where the runner can.
        fork_min_tokens = self.config.share_prefix_min if self.config.cache_prompt and can.can_fork else 0
        if self.config.deterministic:
            # Cross-slot prefix sharing is off in deterministic mode: the invariance tests do not
            # cover it, so it is not promised. An n-request's forks stay (the runner applies them
            # in _execute_invariant too): they copy sample 0's prefill-computed prompt KV, bit for bit.
            fork_min_tokens = 0
        self.telemetry = Telemetry()
        # Everything below is shared between callers and the engine thread, under _cond.
        self._cond = threading.Condition()
        # Requests with a grammar are sampled on sampling threads, so one slow grammar does not
        # set every slot's pace (sampling_threads.py). Deterministic mode keeps inline sampling.
        # Where llama_decode's threads take every core, the sampling threads pause while it runs.
        self.sampling_threads = (SamplingThreads(self._cond, runner.n_slots,
                                                 yield_to_decode=self.config.n_threads >= usable_cpus())
                                 if can.can_sample_apart and not self.config.deterministic else None)
        self.disk = open_disk(self.config, runner) if open_disk else None  # the disk prefix store, or None
        # A slot's own cache is reused only where a Trim can keep part of it (plan.Trim).
        # Speculative decoding (speculation.py): where the runner can verify guesses and keep part
        # of a slot (a Trim removes the turned-down ones). Deterministic mode pads every decode
        # token with rows after it in its stream (batch_invariance.py): a guess takes one of
        # them at no cost, and no slot takes more rows than the pass can pad.
        speculating = (self.config.speculation == "auto" and can.can_verify and can.can_trim
                       and self.config.cache_prompt)
        self.scheduler = Scheduler(runner.n_slots, runner.slot_ctx, self.config.n_batch, self.config.chunk_size,
                                   self.config.policy, self.config.cache_prompt and can.can_trim,
                                   runner.token_bytes, runner.is_eog,
                                   fork_min_tokens=fork_min_tokens, cache_generated=not self.config.deterministic,
                                   sample_apart=((lambda seq: wants_apart(seq.params, seq.sampler))
                                                 if self.sampling_threads else None),
                                   disk=self.disk,
                                   speculation=Speculation(runner.graph_runs, runner.valid_guesses, **can.draft_limits)
                                   if speculating else None,
                                   pool_cells=can.pool_cells, moves=self.config.slot_moves and can.can_fork,
                                   park=runner.snapshot if can.can_park else None,
                                   reserved=self.config.reserved_slots,
                                   park_budget=park_budget(runner),
                                   restored_whole_below=can.restored_whole_below,
                                   keep_floor=runner.keep_floor,
                                   take_forced=runner.accept_forced, max_decode_rows=can.max_decode_rows)
        self._tick_interrupt = TickInterrupt(runner)  # under _cond: an urgent arrival stops the decode in flight
        self._requests = OpenRequests(self.telemetry, self.config.deterministic)  # without a Result yet
        # what submit() and cancel() left for the engine thread: (lane, request) pairs, in order
        self._inbox: list[tuple[WorkLane, Any]] = []
        self._rejected: list[tuple[RequestHandle, LlamaBatchError]] = []  # bad input, ended on the engine thread
        self._cancels: list[tuple[WorkLane, Any]] = []
        next_tick = itertools.count(1).__next__  # one numbering for every lane's tick records
        self.generation = GenerationLane(
            runner, self.scheduler, self._requests, self._cond, sampling_threads=self.sampling_threads,
            disk=self.disk, tick_interrupt=self._tick_interrupt, next_tick=next_tick,
            queued_priorities=lambda: (item.params.priority for lane, item in self._inbox
                                       if lane is self.generation))
        self.embedding = EmbeddingLane(runner, self._requests, next_tick)
        # the order every tick runs them in: embeddings take their own llama_decode after
        # generation's, so each kind of work moves every tick (llama/embedder.py says why apart)
        self.lanes: tuple[WorkLane, ...] = (self.generation, self.embedding)
        self._next_id = 0
        self._closing = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="llamabatch-engine", daemon=True)
        self._thread.start()

    # -- public API (llamabatch.api.EngineAPI; generate and the context manager: engine_base.py)

    @property
    def default_params(self) -> SamplingParams:
        return self.inputs.default_params

    @property
    def model_name(self) -> str:
        """What records call the model: the user's spelling for store names, else the file name."""
        return self._model_name

    @property
    def chat_template(self):
        """The template chat messages are rendered with (the GGUF's own, or a built-in);
        a fallback is reported once through `on_notice` when it is first chosen."""
        return self.inputs.chat_template

    @property
    def on_notice(self) -> Callable[[str], None]:
        """Called with one line for people (a chat-template fallback); default: a log warning."""
        return self.inputs.on_notice

    @on_notice.setter
    def on_notice(self, callback: Callable[[str], None]) -> None:
        self.inputs.on_notice = callback

    def tokenize(self, text: str, *, special: bool = False, add_special: bool = True) -> list[int]:
        if add_special:  # the runner's default: runners written before add_special need not know it
            return self.runner.tokenize(text, special=special)
        return self.runner.tokenize(text, special=special, add_special=False)

    def token_pieces(self, tokens: Seq[int]) -> list[bytes]:
        return [self.runner.token_piece(t) for t in checked_token_ids(tokens, self.runner.n_vocab)]

    @property
    def ready(self) -> bool:
        return not self._closing

    def render_chat(self, messages: Seq[dict]) -> str:
        return self.inputs.render_chat(messages)

    def submit(self, prompt: Prompt, params: SamplingParams | None = None, *, stream: bool = True,
               callback: EventCallback | None = None) -> RequestHandle:
        """Queue one request. Never blocks on generation.

        `prompt` is text, a list of token ids, or chat messages. Bad input does not raise:
        the handle ends without reaching a slot, with finish_reason 'error' (on the engine
        thread, like every other outcome). Raises QueueFull when `max_queue` requests are
        already waiting, EngineClosed after close().
        """
        with self._cond:
            if self._closing:
                raise EngineClosed("the engine is closed")
            request_id = self._next_id
            self._next_id += 1
        handle = RequestHandle(self._cancel, request_id, stream, callback)
        try:
            seq = self.inputs.prepare(request_id, prompt, params)
        except Exception as exc:
            return self._refuse(handle, exc, "request")
        with self._cond:
            try:
                self._queue(handle, self.generation, seq)
            except (EngineClosed, QueueFull):  # never entered: its chains are freed here
                free_samplers(self.runner, seq)
                raise
            self.generation.waiting += 1
            self._tick_interrupt.arrived(seq.params.priority)
        return handle

    def _submit_embed(self, request: EmbedRequest, callback: EventCallback | None) -> RequestHandle:
        """Queue one embeddings request (engine_base.py's submit_embedding); bad input ends the
        handle with 'error', on the engine thread, as submit does."""
        with self._cond:
            if self._closing:
                raise EngineClosed("the engine is closed")
            request_id = self._next_id
            self._next_id += 1
        handle = RequestHandle(self._cancel, request_id, False, callback)
        handle.kind = "embed"
        try:
            job = prepare_job(self.runner, request_id, request)
        except Exception as exc:
            return self._refuse(handle, exc, "embeddings request")
        with self._cond:
            self._queue(handle, self.embedding, job)
        return handle

    def _queue(self, handle: RequestHandle, lane: WorkLane, item: Any) -> None:
        """Hand a prepared request to the engine thread for `lane` (the caller holds the lock);
        counted only once accepted: a refused one (QueueFull, EngineClosed) never entered."""
        if self._closing:
            raise EngineClosed("the engine is closed")
        check_room(len(self._requests), len(self.scheduler.slots), self.config.max_queue)
        handle._work = (lane, item)
        self.telemetry.totals.submitted += 1
        self._requests.add(handle)
        self._inbox.append((lane, item))
        self._cond.notify()

    def _refuse(self, handle: RequestHandle, exc: Exception, what: str) -> RequestHandle:
        """A request whose input could not be prepared: its handle ends with this error, on
        the engine thread, like every other outcome (submit and submit_embedding share it)."""
        if not isinstance(exc, LlamaBatchError):  # a bug, or a value that slipped past the checks
            log.exception("%s %s could not be prepared", what, handle.request_id)
            exc = InternalError(f"{type(exc).__name__}: {exc}")  # this request's error only
        with self._cond:
            if self._closing:
                raise EngineClosed("the engine is closed") from None
            self.telemetry.totals.submitted += 1
            self._rejected.append((handle, exc))
            self._cond.notify()
        return handle

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Keep the engine thread from picking up new requests until the block ends, so every
        request submitted inside it is admitted in the same tick (a benchmark starts B
        sequences together this way). Only submit inside: waiting for a result would deadlock."""
        with self._cond:  # the loop takes the inbox under this lock
            yield

    def stats(self) -> EngineStats:
        slots = self.scheduler.slots
        return self.telemetry.stats([s.state for s in slots], self.generation.waiting, self.slot_ctx,
                                    self.scheduler.reserved, sum(len(s.cached) for s in slots))

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Receive every TickRecord and RequestRecord (on the engine thread). Returns unsubscribe."""
        return self.telemetry.subscribe(callback)

    def close(self, timeout: float | None = None) -> None:
        """Cancel what is in flight, stop the thread, free the context and model once.
        (`timeout` is for engines in another process: this thread is always waited for.)"""
        with self._cond:
            already = self._closing
            self._closing = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        if not already:
            log.debug("engine closed")

    def kill(self) -> None:
        """Stop without waiting: what is in flight ends 'cancelled' once the current step is
        done (a step in llama_decode cannot be interrupted); close() then waits for the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def _cancel(self, handle: RequestHandle) -> None:
        with self._cond:
            if handle._work is not None:
                self._cancels.append(handle._work)  # the lane ends every sample of an n-request
                self._cond.notify()

    # -- the engine thread -----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._inbox or self._rejected or self._cancels or self._closing
                               or any(lane.has_work() for lane in self.lanes)):
                        # Nothing to run: sleep until something arrives, a token sampled apart
                        # lands (it notifies), or the next deadline passes (a request whose
                        # token is in flight must still time out).
                        deadline = min((d for d in (lane.next_deadline() for lane in self.lanes)
                                        if d is not None), default=None)
                        if deadline is not None and deadline <= time.perf_counter():
                            break
                        self._cond.wait(None if deadline is None else deadline - time.perf_counter())
                    if self._closing:
                        break
                    arrived = self._take_arrivals()
                    cancels, self._cancels = self._cancels, []
                self._accept(*arrived)
                self._tick(cancels)
        except BaseException as exc:  # never leave a caller waiting on a dead thread
            log.exception("engine thread failed")
            for lane in self.lanes:
                lane.end_all("error", f"engine failed: {exc}", "engine_error")
        finally:
            self._shutdown()

    def _take_arrivals(self) -> tuple[list[tuple[WorkLane, Any]], list]:
        """What submit() left since the last tick (the caller holds the lock)."""
        new, self._inbox = self._inbox, []
        rejected, self._rejected = self._rejected, []
        return new, rejected

    def _accept(self, new: list[tuple[WorkLane, Any]], rejected: list) -> None:
        for handle, exc in rejected:
            self._requests.reject(handle, exc)
        for lane, item in new:
            lane.take(item)

    def _tick(self, cancels: list[tuple[WorkLane, Any]]) -> None:
        t_start = time.perf_counter()
        for lane, item in cancels:
            lane.cancel(item)
        for lane in self.lanes:
            lane.expire(t_start)
        for lane in self.lanes:
            lane.step(t_start)

    def _shutdown(self) -> None:
        with self._cond:
            self._closing = True
            arrived = self._take_arrivals()
        self._accept(*arrived)
        for lane in self.lanes:
            lane.end_all("cancelled")
        for lane in self.lanes:
            lane.close()
        if not self._closed:
            self._closed = True
            if self.disk is not None:
                self.disk.close()  # bounded: a write cut short leaves no loadable entry
            self.runner.close()
