"""Engine: one background thread owns the llama context and runs the tick loop.

Callers submit from any thread and get a RequestHandle that streams Deltas and ends with
exactly one Result (finish_reason stop, length, cancelled, error or timeout).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence as Seq, Union

from .config import EngineConfig
from .errors import ContextOverflow, DecodeError, EngineClosed, InvalidRequest, LlamaBatchError, QueueFull
from .params import SamplingParams, random_seed
from .plan import StepPlan, StepResult
from .results import Delta, Result, Timings, Usage
from .scheduler import Scheduler, SeqEvent
from .sequence import Sequence, Status
from .telemetry import RequestRecord, Telemetry, TickRecord

log = logging.getLogger("llamabatch.engine")

Prompt = Union[str, Seq[int], Seq[dict]]
EventCallback = Callable[["RequestHandle", Union[Delta, Result]], None]
_END = object()


class RequestHandle:
    """One submitted request. Iterate it for streamed Deltas; `result()` gives the Result."""

    def __init__(self, engine: "Engine | None", request_id: int, stream: bool, callback: EventCallback | None):
        self._engine = engine
        self.request_id = request_id
        self._stream = stream
        self._callback = callback
        self._deltas: list[Any] = []
        self._cond = threading.Condition()
        self._result: Result | None = None
        self._seq: Sequence | None = None

    def __iter__(self) -> Iterator[Delta]:
        i = 0
        while True:
            with self._cond:
                while i >= len(self._deltas):
                    self._cond.wait()
                item = self._deltas[i]
            i += 1
            if item is _END:
                return
            yield item

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the terminal Result (raises TimeoutError if `timeout` seconds pass first)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._result is not None, timeout):
                raise TimeoutError(f"request {self.request_id} still running after {timeout}s")
            return self._result  # type: ignore[return-value]

    @property
    def done(self) -> bool:
        return self._result is not None

    def cancel(self) -> None:
        """Ask the engine to stop this request; its Result gets finish_reason 'cancelled'."""
        if self._engine is not None and self._result is None:
            self._engine._cancel(self)

    # -- called by the engine thread --------------------------------------------------

    def _deliver(self, delta: Delta) -> None:
        if self._stream:
            with self._cond:
                self._deltas.append(delta)
                self._cond.notify_all()
        if self._callback is not None:
            self._call(delta)

    def _call(self, item: Any) -> None:
        try:
            self._callback(self, item)  # type: ignore[misc]
        except Exception:  # a caller's bug must not stop the engine serving everyone else
            log.exception("callback for request %s failed", self.request_id)

    def _finish(self, result: Result) -> None:
        with self._cond:
            if self._result is not None:
                return  # exactly one terminal outcome
            self._result = result
            self._deltas.append(_END)
            self._cond.notify_all()
        if self._callback is not None:
            self._call(result)


@dataclass
class EngineStats:
    slots_idle: int
    slots_prefilling: int
    slots_generating: int
    queue_depth: int
    n_parallel: int
    slot_ctx: int
    submitted: int
    finished: int
    cancelled: int
    failed: int
    timed_out: int
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    ticks: int
    uptime_s: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Engine:
    """A continuous-batching engine over one model. Use it as a context manager."""

    def __init__(self, config: EngineConfig | None = None, *, runner: Any = None,
                 default_params: SamplingParams | None = None):
        self.config = (config or EngineConfig()).validate()
        self.default_params = (default_params or SamplingParams()).validate()
        if runner is None:
            from .models import check_gguf, resolve_model
            from .runner import LlamaRunner  # the only import of llama_cpp, kept lazy

            path = resolve_model(self.config.model)
            check_gguf(path)
            runner = LlamaRunner(self.config, path)
            self.model_path = path
        else:
            self.model_path = getattr(runner, "model_path", "fake")
        self.runner = runner
        self.slot_ctx = runner.slot_ctx
        self.scheduler = Scheduler(runner.n_slots, runner.slot_ctx, self.config.n_batch, self.config.chunk_size,
                                   self.config.policy, self.config.cache_prompt, runner.token_bytes, runner.is_eog)
        self.telemetry = Telemetry()
        self._chat_template = None
        self._cond = threading.Condition()
        self._inbox: list[Sequence] = []
        self._cancels: list[Sequence] = []
        self._handles: dict[int, RequestHandle] = {}
        self._timed: list[Sequence] = []  # sequences with a deadline
        self._waiting_count = 0  # submitted, not yet given a slot (for max_queue)
        self._next_id = 0
        self._closing = False
        self._closed = False
        self._tick_no = 0
        self._thread = threading.Thread(target=self._loop, name="llamabatch-engine", daemon=True)
        self._thread.start()

    # -- public API ------------------------------------------------------------------------

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def model_name(self) -> str:
        from .models import model_display_name

        return model_display_name(self.model_path)

    @property
    def chat_template(self):
        """The template chat messages are rendered with (the GGUF's own, or a built-in)."""
        if self._chat_template is None:
            from .chat_template import from_gguf

            meta = getattr(self.runner, "metadata", {})
            self._chat_template = from_gguf(meta.get("tokenizer.chat_template"), meta.get("general.architecture"),
                                            bos_token=getattr(self.runner, "bos_text", ""),
                                            eos_token=getattr(self.runner, "eos_text", ""),
                                            choice=self.config.chat_template)
        return self._chat_template

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return self.runner.tokenize(text, special=special)

    def render_chat(self, messages: Seq[dict]) -> str:
        from .chat_template import validate_messages

        return self.chat_template.render(validate_messages(messages), add_generation_prompt=True)

    def submit(self, prompt: Prompt, params: SamplingParams | None = None, *, stream: bool = True,
               callback: EventCallback | None = None) -> RequestHandle:
        """Queue one request. Never blocks on generation.

        `prompt` is text, a list of token ids, or chat messages. Bad input does not raise:
        the handle ends at once with finish_reason 'error'. Raises QueueFull when
        `max_queue` requests are already waiting, EngineClosed after close().
        """
        if self._closing:
            raise EngineClosed("the engine is closed")
        with self._cond:
            request_id = self._next_id
            self._next_id += 1
            self.telemetry.totals.submitted += 1
        handle = RequestHandle(self, request_id, stream, callback)
        try:
            params = (params or self.default_params).validate()
            tokens = self._prompt_tokens(prompt)
            if _is_chat(prompt) and self.chat_template.stop:
                # formats without special tokens (the plain transcript) need their own stops
                params = params.replace(stop=[*params.stop, *(s for s in self.chat_template.stop if s not in params.stop)])
            seed = params.seed if params.seed is not None else (
                self.config.seed if self.config.seed is not None else random_seed())
            sampler = self.runner.build_sampler(params, seed)
        except LlamaBatchError as exc:
            self._fail_early(handle, exc)
            return handle
        seq = Sequence(request_id, tokens, params, seed, sampler)
        handle._seq = seq
        with self._cond:
            if self._closing:
                self.runner.free_sampler(sampler)
                raise EngineClosed("the engine is closed")
            # Count every request in flight against slots + max_queue, not the requests the
            # engine thread has not admitted yet: those include ones an idle slot is about to
            # take, so a quick second submit would be refused depending on thread timing.
            if self.config.max_queue and len(self._handles) >= len(self.scheduler.slots) + self.config.max_queue:
                self.runner.free_sampler(sampler)
                self.telemetry.totals.submitted -= 1  # rejected: never entered the engine
                raise QueueFull(f"queue is full ({self.config.max_queue} requests waiting)")
            self._waiting_count += 1
            self._handles[request_id] = handle
            self._inbox.append(seq)
            self._cond.notify()
        return handle

    def generate(self, prompts: Seq[Prompt], params: SamplingParams | Seq[SamplingParams] | None = None) -> list[Result]:
        """Run every prompt concurrently; results come back in input order."""
        per = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(per) != len(prompts):
            raise InvalidRequest(f"{len(prompts)} prompts but {len(per)} SamplingParams")
        handles: list[RequestHandle] = []
        for prompt, p in zip(prompts, per):
            while True:
                try:
                    handles.append(self.submit(prompt, p, stream=False))
                    break
                except QueueFull:  # a bounded queue: wait for an earlier request, then retry
                    pending = [h for h in handles if not h.done]
                    if pending:
                        try:
                            pending[0].result(timeout=1.0)
                        except TimeoutError:
                            pass
                    else:
                        time.sleep(0.01)
        return [h.result() for h in handles]

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Keep the engine thread from picking up new requests until the block ends, so every
        request submitted inside it is admitted in the same tick (a benchmark starts B
        sequences together this way). Only submit inside: waiting for a result would deadlock."""
        with self._cond:  # the loop takes the inbox under this lock
            yield

    def stats(self) -> EngineStats:
        states = [s.state for s in self.scheduler.slots]
        t = self.telemetry.totals
        return EngineStats(
            slots_idle=states.count("idle"), slots_prefilling=states.count("prefilling"),
            slots_generating=states.count("generating"), queue_depth=self._waiting_count,
            n_parallel=len(states), slot_ctx=self.slot_ctx,
            submitted=t.submitted, finished=t.finished, cancelled=t.cancelled, failed=t.failed,
            timed_out=t.timed_out, prompt_tokens=t.prompt_tokens, cached_tokens=t.cached_tokens,
            generated_tokens=t.generated_tokens, ticks=t.ticks,
            uptime_s=round(time.perf_counter() - self.telemetry.started_at, 3))

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Receive every TickRecord and RequestRecord (on the engine thread). Returns unsubscribe."""
        return self.telemetry.subscribe(callback)

    def close(self) -> None:
        """Cancel what is in flight, stop the thread, free the context and model once."""
        with self._cond:
            if self._closing:
                already = True
            else:
                already = False
                self._closing = True
                self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        if not already:
            log.debug("engine closed")

    # -- submission helpers ----------------------------------------------------------------

    def _prompt_tokens(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequest("prompt is empty")
            tokens = self.runner.tokenize(prompt, special=False)
        elif _is_chat(prompt):
            tokens = self.runner.tokenize(self.render_chat(prompt), special=True)
        elif isinstance(prompt, (list, tuple)):
            if not prompt:
                raise InvalidRequest("prompt is empty")
            n_vocab = getattr(self.runner, "n_vocab", None)
            for t in prompt:
                if isinstance(t, bool) or not isinstance(t, int) or t < 0 or (n_vocab and t >= n_vocab):
                    raise InvalidRequest(f"prompt token {t!r} is not a token id of this model")
            tokens = list(prompt)
        else:
            raise InvalidRequest(f"prompt must be text, token ids or chat messages, got {type(prompt).__name__}")
        if len(tokens) >= self.slot_ctx:
            raise ContextOverflow(f"prompt has {len(tokens)} tokens but a slot holds {self.slot_ctx} "
                                  f"(n_ctx / n_parallel), and at least one must be left for the answer")
        return tokens

    def _fail_early(self, handle: RequestHandle, exc: LlamaBatchError) -> None:
        result = Result(handle.request_id, "", [], "error", Usage(), Timings(),
                        error=str(exc), error_code=exc.code)
        self.telemetry.record_request(RequestRecord("exception", handle.request_id, "error", result.usage,
                                                    result.timings, str(exc)))
        handle._finish(result)

    def _cancel(self, handle: RequestHandle) -> None:
        with self._cond:
            if handle._seq is not None:
                handle._seq.cancel_requested = True
                self._cancels.append(handle._seq)
                self._cond.notify()

    # -- the engine thread -----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._inbox or self._cancels or self._closing or self.scheduler.running
                               or self.scheduler.waiting):
                        self._cond.wait()
                    if self._closing:
                        break
                    new, self._inbox = self._inbox, []
                    cancels, self._cancels = self._cancels, []
                for seq in new:
                    self.scheduler.add(seq)
                    if seq.deadline is not None:
                        self._timed.append(seq)
                self._tick(cancels)
        except BaseException as exc:  # never leave a caller waiting on a dead thread
            log.exception("engine thread failed")
            self._fail_everything(f"engine failed: {exc}")
        finally:
            self._shutdown()

    def _tick(self, cancels: list[Sequence]) -> None:
        t_start = time.perf_counter()
        for seq in cancels:
            if not seq.finished:
                self._end(seq, "cancelled")
        if self._timed:
            now = time.perf_counter()
            for seq in [s for s in self._timed if not s.finished and now >= s.deadline]:
                self._end(seq, "timeout")
            self._timed = [s for s in self._timed if not s.finished]
        for seq, slot, reuse in self.scheduler.admit():
            kept = self.runner.keep_prefix(slot, reuse)
            self.scheduler.start(seq, slot, kept)
            self.runner.attach(slot, seq.sampler)
            with self._cond:
                self._waiting_count -= 1
            self.telemetry.record_request(RequestRecord("start", seq.request_id))
        plan = self.scheduler.schedule()
        if not plan:
            return
        active = len(self.scheduler.running)
        plan, result = self._execute(plan)
        for event in self.scheduler.update(plan, result):
            self._deliver(event)
        wall = (time.perf_counter() - t_start) * 1000
        self._tick_no += 1
        self.telemetry.record_tick(TickRecord(
            tick=self._tick_no, batch_size=plan.n_tokens, decode_tokens=plan.decode_tokens,
            prefill_tokens=plan.prefill_tokens, active_slots=active,
            queue_depth=len(self.scheduler.waiting), eval_ms=result.eval_ms, sample_ms=result.sample_ms,
            overhead_ms=max(0.0, wall - result.eval_ms - result.sample_ms), wall_ms=wall))

    def _execute(self, plan: StepPlan) -> tuple[StepPlan, StepResult]:
        """One llama_decode; on 'no KV room' defer prefill, then halve, never crash."""
        while True:
            want_logprobs = {c.slot: self.scheduler.slots[c.slot].seq.params.logprobs
                             for c in plan.chunks if c.wants_logits
                             and self.scheduler.slots[c.slot].seq.params.logprobs is not None}
            result = self.runner.execute(plan, want_logprobs)
            if result.status == 0:
                return plan, result
            if result.status < 0 or len(plan.chunks) == 1:
                why = "no room left in the KV cache" if result.status == 1 else f"llama_decode returned {result.status}"
                for chunk in plan.chunks:
                    seq = self.scheduler.slots[chunk.slot].seq
                    self.runner.keep_prefix(chunk.slot, 0)
                    self.scheduler.forget_slot(chunk.slot)
                    if seq is not None and not seq.finished:
                        self._end(seq, "error", str(DecodeError(why)), DecodeError.code)
                return StepPlan(), StepResult(eval_ms=result.eval_ms)
            decodes = [c for c in plan.chunks if c.is_decode]
            if 0 < len(decodes) < len(plan.chunks):
                plan = StepPlan(decodes)  # defer prefill to a later tick
            else:
                plan = StepPlan(plan.chunks[: len(plan.chunks) // 2])

    def _deliver(self, event: SeqEvent) -> None:
        seq = event.seq
        handle = self._handles.get(seq.request_id)
        if handle is None:
            return
        if event.text or event.tokens:
            handle._deliver(Delta(event.text, event.tokens))
        if event.finished:
            self._complete(seq)

    def _end(self, seq: Sequence, reason: str, error: str | None = None, code: str | None = None) -> None:
        """End a sequence from outside the token flow (cancel, timeout, failure)."""
        was_waiting = seq.status == Status.WAITING
        tail = self.scheduler.finish(seq, reason, error, code)
        if was_waiting:
            with self._cond:
                self._waiting_count -= 1
        handle = self._handles.get(seq.request_id)
        if tail and handle is not None:
            handle._deliver(Delta(tail, []))
        self._complete(seq)

    def _complete(self, seq: Sequence) -> None:
        self.runner.free_sampler(seq.sampler)
        seq.sampler = None
        result = _result_of(seq)
        handle = self._handles.pop(seq.request_id, None)
        kind = "exception" if result.finish_reason == "error" else "done"
        self.telemetry.record_request(RequestRecord(kind, seq.request_id, result.finish_reason, result.usage,
                                                    result.timings, result.error))
        if handle is not None:
            handle._finish(result)

    def _fail_everything(self, message: str) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            if not seq.finished:
                self._end(seq, "error", message, "engine_error")

    def _shutdown(self) -> None:
        with self._cond:
            self._closing = True
            new, self._inbox = self._inbox, []
        for seq in new:
            self.scheduler.add(seq)
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            if not seq.finished:
                self._end(seq, "cancelled")
        if not self._closed:
            self._closed = True
            self.runner.close()


def _is_chat(prompt: Prompt) -> bool:
    return isinstance(prompt, (list, tuple)) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


def _result_of(seq: Sequence) -> Result:
    admitted = seq.admitted_at or seq.finished_at
    first = seq.first_token_at
    end = seq.finished_at or time.perf_counter()
    prompt_ms = ((first or end) - admitted) * 1000 if admitted else 0.0
    decode_ms = (end - first) * 1000 if first else 0.0
    evaluated = len(seq.prompt) - seq.num_cached
    timings = Timings(
        queue_ms=((seq.admitted_at or end) - seq.submitted_at) * 1000,
        ttft_ms=(first - seq.submitted_at) * 1000 if first else 0.0,
        prompt_ms=prompt_ms, decode_ms=decode_ms,
        prompt_tokens_per_s=evaluated / (prompt_ms / 1000) if first and prompt_ms > 0 else 0.0,
        generated_tokens_per_s=(len(seq.output) - 1) / (decode_ms / 1000) if decode_ms > 0 and len(seq.output) > 1 else 0.0)
    usage = Usage(prompt_tokens=len(seq.prompt), cached_tokens=seq.num_cached, completion_tokens=len(seq.output))
    return Result(seq.request_id, seq.text, list(seq.output), seq.finish_reason or "error", usage, timings,
                  seed=seq.seed, error=seq.error, error_code=seq.error_code, stop=seq.stop_hit,
                  logprobs=seq.logprobs)
