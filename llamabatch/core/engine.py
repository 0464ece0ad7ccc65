"""EngineCore: one background thread owns the llama context and runs the tick loop.

Callers submit from any thread and get a RequestHandle that streams Deltas and ends with
exactly one Result (finish_reason stop, length, cancelled, error or timeout).

Who does what: `inputs.InputPreparer` turns a prompt into a Sequence (caller's thread);
the `Scheduler` decides what runs next (admission, the plan, deadlines, the smaller plan
after "no KV room"); the runner executes a plan; `Sequence.result()` builds the Result.
What is left here is the thread, the hand-over between callers and that thread, and the
tick that strings the parts together.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator, Sequence as Seq

from .sampling_threads import GRACE, SampleJobRun, SamplingThreads, wants_apart
from .embedding import EmbedJob, EmbedQueue, EmbedRequest, prepare_job
from ..config import EngineConfig
from ..errors import DecodeError, EngineClosed, InternalError, LlamaBatchError, QueueFull
from .handle import EventCallback, RequestHandle
from .inputs import ChatTemplates, InputPreparer, Prompt
from ..params import SamplingParams
from .plan import INTERRUPTED, EmbedBatch, Runner, StepPlan, StepResult
from ..results import Delta, EmbeddingResult
from .disk_prefix import DiskPrefixes
from .scheduler import PrefixToSave, Scheduler, SeqEvent
from .sequence import Sequence, Status
from .engine_base import EngineBase, check_room, checked_token_ids, error_result, record_outcome
from .speculation import Speculation
from .telemetry import EngineStats, RequestRecord, Telemetry, TickRecord
from .tick_interrupt import TickInterrupt

log = logging.getLogger("llamabatch.engine")

# Callers that hold an engine import the types of its API from here.
__all__ = ["EngineCore", "EngineStats", "RequestHandle", "Prompt", "EventCallback"]


def park_budget(runner: Runner) -> int:
    """Bytes of preempted requests' KV kept in memory at once: the KV cache's own size (what the
    memory checks counted once), 1 GiB where the runner does not know it."""
    kv_mib = runner.kv_mib
    return int(kv_mib * 2**20) if isinstance(kv_mib, (int, float)) and kv_mib > 0 else 1 << 30


class EngineCore(EngineBase):
    """The continuous-batching engine over a runner it is given (llamabatch.api.EngineAPI): the
    tick loop and its thread. `llamabatch.Engine` (in_process/engine.py) is this class with the
    model loaded and what lives in higher layers handed in; use that one."""

    def __init__(self, config: EngineConfig | None = None, *, runner: Any,
                 default_params: SamplingParams | None = None,
                 on_notice: Callable[[str], None] | None = None, slots_reason: str = "",
                 chat_templates: ChatTemplates | None = None, disk: DiskPrefixes | None = None):
        """An engine over `runner` (loaded, with its slots) with `config`, whose settings are
        decided already: the model and n_parallel are the runner's. What comes from the layers
        above is handed in: `chat_templates` (None: chat messages are refused), `disk` (the
        disk prefix store opened for this runner, or None). llamabatch.engines builds engines
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
        self.inputs = InputPreparer(runner, runner.slot_ctx, params, default_seed=self.config.seed,
                                    chat_template=self.config.chat_template, chat_templates=chat_templates,
                                    on_notice=on_notice or (lambda line: log.warning("%s", line)))
        # Prefix sharing across slots forks KV between slots: only where the runner can.
        fork_min_tokens = self.config.share_prefix_min if self.config.cache_prompt and runner.can_fork else 0
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
                                                 yield_to_decode=self.config.n_threads >= (os.cpu_count() or 1))
                                 if runner.can_sample_apart and not self.config.deterministic else None)
        self.disk = disk  # the disk prefix store, or None
        # A slot's own cache is reused only where a Trim can keep part of it (plan.Trim).
        # Speculative decoding (speculation.py): where the runner can verify guesses and keep part
        # of a slot (a Trim removes the turned-down ones). Deterministic mode pads every decode
        # token with rows after it in its stream (batch_invariance.py): a guess takes one of
        # them at no cost, and no slot takes more rows than the pass can pad.
        speculating = (self.config.speculation == "auto" and runner.can_verify and runner.can_trim
                       and self.config.cache_prompt)
        self.scheduler = Scheduler(runner.n_slots, runner.slot_ctx, self.config.n_batch, self.config.chunk_size,
                                   self.config.policy, self.config.cache_prompt and runner.can_trim,
                                   runner.token_bytes, runner.is_eog,
                                   fork_min_tokens=fork_min_tokens, cache_generated=not self.config.deterministic,
                                   sample_apart=((lambda seq: wants_apart(seq.params, seq.sampler))
                                                 if self.sampling_threads else None),
                                   disk=self.disk,
                                   speculation=Speculation(runner.graph_runs, runner.valid_guesses, **runner.draft_limits)
                                   if speculating else None,
                                   pool_cells=runner.pool_cells, moves=self.config.slot_moves and runner.can_fork,
                                   park=runner.snapshot if runner.can_park else None,
                                   reserved=self.config.reserved_slots,
                                   park_budget=park_budget(runner),
                                   restored_whole_below=runner.restored_whole_below,
                                   keep_floor=runner.keep_floor)
        self._preemptions = 0  # requests parked since the last tick record
        self._tick_interrupt = TickInterrupt(runner)  # under _cond: an urgent arrival stops the decode in flight
        self._inbox: list[Sequence | EmbedJob] = []
        self.embeds = EmbedQueue()  # accepted embeddings requests (embedding.py)
        self._rejected: list[tuple[RequestHandle, LlamaBatchError]] = []  # bad input, ended on the engine thread
        self._cancels: list[Sequence] = []
        self._handles: dict[int, RequestHandle] = {}
        self._waiting_count = 0  # submitted, not yet given a slot (for max_queue)
        self._next_id = 0
        self._closing = False
        self._closed = False
        self._tick_no = 0
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
        handle._seq = seq
        with self._cond:
            if self._closing:
                self._free_samplers(seq)
                raise EngineClosed("the engine is closed")
            try:
                check_room(len(self._handles), len(self.scheduler.slots), self.config.max_queue)
            except QueueFull:
                self._free_samplers(seq)
                raise
            # counted only once accepted: a refused request (QueueFull, EngineClosed) never entered
            self.telemetry.totals.submitted += 1
            self._waiting_count += 1
            self._handles[request_id] = handle
            self._inbox.append(seq)
            self._tick_interrupt.arrived(seq.params.priority)
            self._cond.notify()
        return handle

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
        handle._job = job
        with self._cond:
            if self._closing:
                raise EngineClosed("the engine is closed")
            check_room(len(self._handles), len(self.scheduler.slots), self.config.max_queue)
            self.telemetry.totals.submitted += 1
            self._handles[request_id] = handle
            self._inbox.append(job)
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
        return self.telemetry.stats([s.state for s in slots], self._waiting_count, self.slot_ctx,
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

    def _free_samplers(self, seq: Sequence) -> None:
        for member in seq.members:
            self.runner.free_sampler(member.sampler)
            member.sampler = None

    def _cancel(self, handle: RequestHandle) -> None:
        with self._cond:
            target = handle._seq if handle._seq is not None else handle._job
            if target is not None:
                self._cancels.append(target)  # _end ends every sample of an n-request
                self._cond.notify()

    # -- the engine thread -----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._inbox or self._rejected or self._cancels or self._closing
                               or self.scheduler.has_work() or self.embeds.has_work()
                               or (self.sampling_threads and self.sampling_threads.has_landed)):
                        # Nothing to run: sleep until something arrives, a token sampled apart
                        # lands (it notifies), or the next deadline passes (a request whose
                        # token is in flight must still time out).
                        deadline = min((d for d in (self.scheduler.next_deadline(), self.embeds.next_deadline())
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
            self._fail_everything(f"engine failed: {exc}")
        finally:
            self._shutdown()

    def _take_arrivals(self) -> tuple[list[Sequence], list]:
        """What submit() left since the last tick (the caller holds the lock)."""
        new, self._inbox = self._inbox, []
        rejected, self._rejected = self._rejected, []
        return new, rejected

    def _accept(self, new: list[Sequence | EmbedJob], rejected: list) -> None:
        for handle, exc in rejected:
            self._reject(handle, exc)
        for item in new:
            if isinstance(item, EmbedJob):
                self.embeds.add(item)
            else:
                self.scheduler.add(item)

    def _tick(self, cancels: list[Sequence | EmbedJob]) -> None:
        t_start = time.perf_counter()
        for seq in cancels:
            if isinstance(seq, EmbedJob):
                if not seq.finished:
                    self._end_embed(seq, "cancelled")
            elif not seq.finished:
                self._end(seq, "cancelled")
        for seq in self.scheduler.expired(t_start):
            self._end(seq, "timeout")
        for job in self.embeds.expired(t_start):
            self._end_embed(job, "timeout")
        self._take_threaded_samples()
        self._admit()
        plan = self.scheduler.schedule()
        t_planned = time.perf_counter()
        if plan:
            self._generate(plan, t_start, t_planned)
        # Embeddings take their own llama_decode after generation's, every tick they have
        # work: each kind of work moves every tick (llama/embedder.py says why apart).
        if self.embeds.has_work():
            self._embed_step()

    def _generate(self, plan: StepPlan, t_start: float, t_planned: float) -> None:
        active = len(self.scheduler.running)
        with self.sampling_threads.decoding() if self.sampling_threads else contextlib.nullcontext():
            plan, result = self._execute(plan)
        events = self.scheduler.update(plan, result)
        for wanted in self.scheduler.take_saves():  # before any event ends a request and frees its slot
            self._save(wanted)
        # recorded before any event is delivered, so a caller who has its result sees the tick in stats();
        # the forced tokens requests took: a forced run cut by a stop or max_tokens counts only its kept part
        self._record_tick(plan, result, active, t_start, t_planned, forced=sum(e.forced for e in events),
                          accepted=sum(e.accepted for e in events))
        for event in events:
            self._deliver(event)
        for slot, (error, code) in result.failed.items():
            seq = self.scheduler.slots[slot].seq
            if seq is not None and not seq.finished:
                self._end(seq, "error", error, code)
        if result.apart:
            self._launch(plan, result)

    def _save(self, wanted: PrefixToSave) -> None:
        """Snapshot a slot that holds exactly a prefix worth keeping, on this thread (a copy of
        its KV: milliseconds), and queue the write on the store's own thread."""
        try:
            payload = self.runner.snapshot(wanted.slot)
        except Exception:  # the save is an optimisation: a failure never touches the request
            log.exception("could not snapshot slot %d for the prefix store", wanted.slot)
            return
        name = self.disk.save(wanted.tokens, payload)  # type: ignore[union-attr]
        if wanted.seq.params.store_prefix:
            wanted.seq.stored_prefix = name

    def _embed_step(self) -> None:
        t_start = time.perf_counter()
        pooling, items = self.embeds.take(self.runner.embed_max_tokens, self.runner.embed_max_seqs)
        jobs = list(dict.fromkeys(item.job for item in items))  # in order, once each
        for item in items:
            if item.index == 0:  # the request's first batch: it has started
                self.telemetry.record_request(RequestRecord("start", item.job.request_id))
        batch = EmbedBatch(pooling, [item.job.tokens[item.index] for item in items])
        result = self.runner.embed(batch)
        if result.status != 0:
            why = result.error or ("no room in the embedding context" if result.status == 1
                                   else f"llama_decode returned {result.status}")
            error, code = (why, result.code) if result.code else (str(DecodeError(why)), DecodeError.code)
            for job in jobs:
                if not job.finished:
                    self._end_embed(job, "error", error, code)
        else:
            for item, vector in zip(items, result.vectors):
                item.job.take_vector(item.index, vector)
            for job in jobs:
                if job.complete and not job.finished:
                    self._end_embed(job, "stop")
        wall = (time.perf_counter() - t_start) * 1000
        self._tick_no += 1
        self.telemetry.record_tick(TickRecord(
            tick=self._tick_no, batch_size=batch.n_tokens, decode_tokens=0, prefill_tokens=batch.n_tokens,
            active_slots=len(items), queue_depth=len(self.embeds.jobs), eval_ms=result.eval_ms, sample_ms=0.0,
            overhead_ms=max(0.0, wall - result.eval_ms), wall_ms=wall))

    def _end_embed(self, job: EmbedJob, reason: str, error: str | None = None, code: str | None = None) -> None:
        """The one terminal outcome of an embeddings request: its vectors ("stop") or none."""
        job.finished = True
        self.embeds.remove(job)
        if reason == "stop":
            result = job.result(self.config.deterministic)
        else:
            result = EmbeddingResult.ended(error_result(job.request_id, error or "", code or "", deterministic=self.config.deterministic))
            result.finish_reason, result.error, result.error_code = reason, error, code
        handle = self._handles.pop(job.request_id, None)
        record_outcome(self.telemetry, result)
        if handle is not None:
            handle._finish(result)

    def _launch(self, plan: StepPlan, result: StepResult) -> None:
        """Start the tick's SampleJobs, then wait a little: a cheap grammar's token still makes
        this tick, a slow one's slot skips ticks until it lands (see sampling_threads.py)."""
        assert self.sampling_threads is not None
        runs = []
        for chunk in plan.chunks:
            job = result.apart.get(chunk.slot)
            if job is not None:
                runs.append(self.sampling_threads.launch(self.scheduler.slots[chunk.slot].seq, chunk, job))
        waited = self.sampling_threads.wait(runs, GRACE * result.eval_ms / 1000)
        result.sample_ms += waited * 1000
        self._take_threaded_samples()

    def _take_threaded_samples(self) -> None:
        """Take the tokens sampled apart since the last look; free the chains of requests that
        ended while their token was in run."""
        if self.sampling_threads is None:
            return
        for run in self.sampling_threads.take_landed():
            self._apply_threaded_sample(run)

    def _apply_threaded_sample(self, run: SampleJobRun) -> None:
        for sampler in self.sampling_threads.orphans_of(run):  # type: ignore[union-attr]
            self.runner.free_sampler(sampler)
        seq = run.seq
        if seq.finished or run.outcome is None and run.error is None:
            return  # ended (cancel, timeout, close) while its token was in run
        if run.error is not None:
            self._end(seq, "error", str(InternalError(f"sampling failed: {type(run.error).__name__}: "
                                                       f"{run.error}")), InternalError.code)
            return
        sampled, logprobs = run.outcome  # type: ignore[misc]
        for event in self.scheduler.accept_apart(run.chunk, sampled, logprobs):
            self._deliver(event)

    def _admit(self) -> None:
        admitted = self.scheduler.admit()
        parked = self.scheduler.take_preempted()  # put aside for higher-priority requests: waiting again
        if parked:
            self._preemptions += len(parked)
            with self._cond:
                self._waiting_count += len(parked)
        for seq, slot, reuse, _fork in admitted:
            resumed = seq.parked is not None
            # the slot's KV change (a Trim to `reuse`, a Fork or a Restore) rides on this tick's plan
            self.scheduler.start(seq, slot, reuse)
            if seq.index == 0:  # samples 1..n-1 ride along with sample 0 (the one queued and counted)
                with self._cond:
                    self._waiting_count -= 1
                if not resumed:
                    self.telemetry.record_request(RequestRecord("start", seq.request_id))

    def _execute(self, plan: StepPlan) -> tuple[StepPlan, StepResult]:
        """One llama_decode; on 'no KV room' try the scheduler's smaller plan, never crash."""
        # the first try applies the plan's restores, trims and forks; a smaller plan carries none
        restored = emptied = None
        while True:
            result = self._execute_interruptibly(plan)
            if restored is None:
                restored, emptied = result.restored, result.emptied
                plan = plan.without_slots(emptied)  # the runner evaluated none of their chunks
            if result.status == 0:
                result.restored, result.emptied = restored, emptied
                return plan, result
            if result.status == INTERRUPTED:  # nothing of it ran: the next tick plans again (tick_interrupt.py)
                return StepPlan(), StepResult(eval_ms=result.eval_ms, restored=restored, emptied=emptied,
                                              interrupted=True)
            smaller = self.scheduler.shrink(plan) if result.status == 1 else None
            if smaller is None:
                self._fail_batch(plan, result.status)
                return StepPlan(), StepResult(eval_ms=result.eval_ms, restored=restored, emptied=emptied)
            plan = smaller

    def _execute_interruptibly(self, plan: StepPlan) -> StepResult:
        best = None
        rows = [self.scheduler.slots[chunk.slot].seq for chunk in plan.chunks]
        # a tick with a fair-share request's rows is never interrupted, or a stream of higher
        # arrivals, one each tick, would stop every tick it has (no starvation: admission.py)
        if self.runner.interruptible(plan) and not any(seq is not None and seq.protected for seq in rows):
            best = min(self._priority_of(chunk.slot) for chunk in plan.chunks)
        runs = self.runner.graph_runs([(c.slot, len(c.tokens)) for c in plan.chunks]) if best is not None else 0
        with self._cond:
            self._tick_interrupt.arm(best, (s.params.priority for s in self._inbox if isinstance(s, Sequence)), runs)
        try:
            result = self.runner.execute(plan)
        finally:
            with self._cond:
                self._tick_interrupt.disarm()
        if result.status == 0:
            self._tick_interrupt.observe(result.eval_ms, result.ubatches)
        return result

    def _priority_of(self, slot: int) -> int:
        seq = self.scheduler.slots[slot].seq
        return seq.params.priority if seq is not None else 0

    def _fail_batch(self, plan: StepPlan, status: int) -> None:
        """End every request in a plan llama_decode refused; their slots' KV is emptied by
        Trims that the next plan carries (Scheduler.forget_slot)."""
        why = "no room left in the KV cache" if status == 1 else f"llama_decode returned {status}"
        for chunk in plan.chunks:
            seq = self.scheduler.slots[chunk.slot].seq
            self.scheduler.forget_slot(chunk.slot)
            if seq is not None and not seq.finished:
                self._end(seq, "error", str(DecodeError(why)), DecodeError.code)

    def _record_tick(self, plan: StepPlan, result: StepResult, active: int, t_start: float,
                     t_planned: float, forced: int = 0, accepted: int = 0) -> None:
        wall = (time.perf_counter() - t_start) * 1000
        if self.scheduler.speculation is not None and plan.chunks:  # what a tick costs here, for choosing guesses
            logit_rows = sum(1 + c.n_draft for c in plan.chunks if c.wants_logits)
            self.scheduler.speculation.cost.observe(result.ubatches, plan.n_tokens, logit_rows,
                                                    result.eval_ms + result.sample_ms)
        plan_ms = (t_planned - t_start) * 1000
        overhead = max(0.0, wall - result.eval_ms - result.sample_ms)
        self._tick_no += 1
        preemptions, self._preemptions = self._preemptions, 0
        self.telemetry.record_tick(TickRecord(
            preemptions=preemptions, rows_by_priority=self._rows_by_priority(plan), interrupted=result.interrupted,
            tick=self._tick_no, batch_size=plan.n_tokens, decode_tokens=plan.decode_tokens,
            prefill_tokens=plan.prefill_tokens, active_slots=active,
            queue_depth=len(self.scheduler.waiting), eval_ms=result.eval_ms, sample_ms=result.sample_ms,
            overhead_ms=overhead, wall_ms=wall, plan_ms=plan_ms, fill_ms=result.fill_ms,
            after_ms=max(0.0, overhead - plan_ms - result.fill_ms), ubatches=result.ubatches,
            forced_tokens=forced, drafted_tokens=plan.draft_tokens, accepted_tokens=accepted,
            moves=len(plan.moves)))

    def _rows_by_priority(self, plan: StepPlan) -> dict[int, int]:
        """The tick's rows by their request's priority; empty when all are priority 0."""
        rows: dict[int, int] = {}
        for chunk in plan.chunks:
            priority = self._priority_of(chunk.slot)
            rows[priority] = rows.get(priority, 0) + len(chunk.tokens)
        return {} if set(rows) <= {0} else rows

    def _deliver(self, event: SeqEvent) -> None:
        seq = event.seq
        handle = self._handles.get(seq.request_id)
        if handle is not None and (event.text or event.tokens):
            handle._deliver(Delta(event.text, event.tokens, seq.index))
        if event.finished:
            self._complete(seq)

    def _end(self, seq: Sequence, reason: str, error: str | None = None, code: str | None = None) -> None:
        """End a sequence from outside the token flow (cancel, timeout, failure). The samples of
        an n-request end together: one request, one outcome."""
        for member in [seq, *(m for m in seq.members if m is not seq)]:
            if member.finished:
                continue
            was_waiting = member.status == Status.WAITING and member.index == 0  # only sample 0 is queued
            tail = self.scheduler.finish(member, reason, error, code)
            if was_waiting:
                with self._cond:
                    self._waiting_count -= 1
            handle = self._handles.get(member.request_id)
            if tail and handle is not None:
                handle._deliver(Delta(tail, [], member.index))
            self._complete(member)

    def _release(self, sampler: Any) -> None:
        """Free a finished request's chain, or, while a sampling thread still uses it, stop that
        job and free the chain when it lands (freeing it under a running job would crash)."""
        if sampler is None:
            return
        if self.sampling_threads is not None and self.sampling_threads.holds(sampler):
            self.sampling_threads.release_later(sampler)
        else:
            self.runner.free_sampler(sampler)

    def _complete(self, seq: Sequence) -> None:
        self._release(seq.sampler)
        seq.sampler = None
        seq.completed = True
        if not all(m.completed for m in seq.members):
            return  # an n-request's Result waits for its last sample
        result = seq.request_result()
        result.deterministic = self.config.deterministic
        handle = self._handles.pop(seq.request_id, None)
        record_outcome(self.telemetry, result)
        if handle is not None:
            handle._finish(result)

    def _reject(self, handle: RequestHandle, exc: LlamaBatchError) -> None:
        """End a request whose input was refused at submit (it never became a Sequence)."""
        result = error_result(handle.request_id, str(exc), exc.code, deterministic=self.config.deterministic)
        if handle.kind == "embed":
            result = EmbeddingResult.ended(result)
        record_outcome(self.telemetry, result)
        handle._finish(result)

    def _fail_everything(self, message: str) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            if not seq.finished:
                self._end(seq, "error", message, "engine_error")
        for job in list(self.embeds.jobs):
            self._end_embed(job, "error", message, "engine_error")

    def _shutdown(self) -> None:
        with self._cond:
            self._closing = True
            arrived = self._take_arrivals()
        self._accept(*arrived)
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            if not seq.finished:
                self._end(seq, "cancelled")
        for job in list(self.embeds.jobs):
            self._end_embed(job, "cancelled")
        if self.sampling_threads is not None:  # the sampling threads use chains and the vocabulary: stop them first
            for run in self.sampling_threads.close():
                for sampler in self.sampling_threads.orphans_of(run):
                    self.runner.free_sampler(sampler)
        if not self._closed:
            self._closed = True
            if self.disk is not None:
                self.disk.close()  # bounded: a write cut short leaves no loadable entry
            self.runner.close()
