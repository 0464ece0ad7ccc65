"""One request's state inside the engine: the request, where it is in the KV cache, what it has
produced and when things happened to it."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from ..params import SamplingParams
from ..results import Result, Timings, Usage


class Status(enum.IntEnum):
    WAITING = 0
    PREFILLING = 1
    GENERATING = 2
    FINISHED = 3
    FORKING = 4  # sample i > 0 of an n-request: holds a slot, waits for sample 0's prompt KV
    RESTORING = 5  # holds a slot whose KV the next plan restores from the disk prefix store


@dataclass(eq=False, slots=True)
class KvPlace:
    """Where a sequence is in the KV cache, and how what its slot holds got there.

    One accounting rule covers prefill, chunked prefill, prefix-cache hits and decode:
    `num_computed` tokens of the sequence's tokens are in the slot's KV cache; the gap up to
    `num_tokens` is what still has to be evaluated (vLLM v1's idea).
    """

    slot: int | None = None
    num_computed: int = 0
    num_cached: int = 0  # prompt tokens reused from the prefix cache
    # The disk prefix store (disk_prefix.py): save the slot's KV when exactly this many prompt
    # tokens are in it (the prefill chunk that crosses it is cut there); of num_cached, how many
    # were restored from the store; the entry a save of this request's prompt was queued as.
    save_at: int | None = None
    num_restored: int = 0
    stored_prefix: str | None = None
    # Preempted for a higher-priority request (core/scheduling/admission.py): its KV kept in host
    # memory (a kv_ledger.Parked) until it resumes where it stopped; None while it holds a slot.
    parked: Any = None


@dataclass(eq=False, slots=True)
class Clock:
    """When things happened to a sequence (time.perf_counter), and its pauses."""

    submitted_at: float = field(default_factory=time.perf_counter)
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    deadline: float | None = None  # submitted_at + the request's timeout
    paused_at: float | None = None  # parked since (preemption), None while it runs
    paused_ms: float = 0.0  # parked, all pauses together
    preemptions: int = 0


@dataclass(eq=False, slots=True)
class Answer:
    """What a sequence has produced so far, and how it ended."""

    output: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None  # a record per output token when the request asks for them
    text: str = ""  # final text, set when finished
    stop_hit: str | None = None  # the stop string that ended it
    finish_reason: str | None = None
    error: str | None = None
    error_code: str | None = None
    forced_tokens: int = 0  # tokens its grammar forced unsampled (llama/sampling/mask_grammar.py)
    # Speculative decoding (core/drafts.py): how many guesses joined its output or were turned down
    accepted_drafts: int = 0
    rejected_drafts: int = 0
    # Thinking models (core/thinking.py): the reasoning text and the tokens generated inside the
    # block, set when it ends; while it answers, its thinking.ReasoningSplit (output_step.py)
    reasoning: str | None = None
    reasoning_tokens: int = 0
    reasoning_split: Any = None


@dataclass(eq=False, slots=True)
class QueuePlace:
    """A sequence's place in the scheduler's queue (core/scheduling/admission.py)."""

    queued: bool = False  # in the queue (admitted ones stay WAITING until started)
    admit_order: int = 0  # FIFO rank among running prefills
    protected: bool = False  # admitted by the fair share: never preempted


@dataclass(eq=False, slots=True)
class Sequence:
    """A request from admission to its terminal outcome: the request as submitted (its prompt,
    parameters and how it is sampled) and its status here; where it is in the KV cache (`kv`),
    what it has produced (`answer`), when things happened to it (`clock`) and its place in the
    scheduler's queue (`queue`). Slots: a write to a name it does not have fails at once."""

    request_id: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    sampler: Any = None  # the runner's sampler chain, built at submit time
    status: Status = Status.WAITING
    index: int = 0  # which sample of an n-request (0 for the sample whose slot evaluates the prompt)
    group: list["Sequence"] | None = None  # all samples of an n-request (shared list), None when n == 1
    completed: bool = False  # the engine has freed its sampler and counted it toward the Result
    sampling_apart: bool = False  # its next token is being sampled on a sampling thread (sampling_threads.py)
    # Structured output (llama/sampling/mask_grammar.py): how its grammar constrains it ("llguidance"
    # masks or llama.cpp's "llama" sampler; None unconstrained).
    grammar_backend: str | None = None
    # Speculative decoding (core/drafts.py): where its guesses come from (None: it drafts none),
    # and the prediction's tokens.
    drafter: Any = None
    prediction: list[int] | None = None
    # Thinking models (core/thinking.py): how its answer may reason (None: the prompt marks no reasoning).
    thinking: Any = None
    kv: KvPlace = field(default_factory=KvPlace)
    answer: Answer = field(default_factory=Answer)
    clock: Clock = field(default_factory=Clock)
    queue: QueuePlace = field(default_factory=QueuePlace)

    def __post_init__(self) -> None:
        if self.params.timeout:
            self.clock.deadline = self.clock.submitted_at + self.params.timeout
        if self.params.logprobs is not None:
            self.answer.logprobs = []

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.answer.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.answer.output)

    @property
    def num_pending(self) -> int:
        return self.num_tokens - self.kv.num_computed

    def pending_tokens(self, limit: int) -> list[int]:
        """The next `limit` tokens that are not yet in the KV cache."""
        start = self.kv.num_computed
        output = self.answer.output
        if start >= len(self.prompt):
            return output[start - len(self.prompt):start - len(self.prompt) + limit]
        end = min(self.num_tokens, start + limit)
        if end <= len(self.prompt):
            return self.prompt[start:end]
        return self.prompt[start:] + output[: end - len(self.prompt)]

    @property
    def finished(self) -> bool:
        return self.status == Status.FINISHED

    @property
    def members(self) -> list["Sequence"]:
        """Every sample of this request (itself alone when n == 1)."""
        return self.group if self.group is not None else [self]

    def result(self) -> Result:
        """The terminal Result: text, tokens, usage and timings from this sequence's clock."""
        clock, answer, kv = self.clock, self.answer, self.kv
        admitted = clock.admitted_at or clock.finished_at
        first = clock.first_token_at
        end = clock.finished_at or time.perf_counter()
        prompt_ms = ((first or end) - admitted) * 1000 if admitted else 0.0
        decode_ms = (end - first) * 1000 if first else 0.0
        evaluated = len(self.prompt) - kv.num_cached
        timings = Timings(
            queue_ms=((clock.admitted_at or end) - clock.submitted_at) * 1000,
            ttft_ms=(first - clock.submitted_at) * 1000 if first else 0.0,
            prompt_ms=prompt_ms, decode_ms=decode_ms,
            prompt_tokens_per_s=evaluated / (prompt_ms / 1000) if first and prompt_ms > 0 else 0.0,
            generated_tokens_per_s=((len(answer.output) - 1) / (decode_ms / 1000)
                                    if decode_ms > 0 and len(answer.output) > 1 else 0.0),
            paused_ms=clock.paused_ms, preemptions=clock.preemptions)
        usage = Usage(prompt_tokens=len(self.prompt), cached_tokens=kv.num_cached,
                      restored_tokens=kv.num_restored, completion_tokens=len(answer.output),
                      accepted_prediction_tokens=answer.accepted_drafts,
                      rejected_prediction_tokens=answer.rejected_drafts,
                      reasoning_tokens=answer.reasoning_tokens if self.thinking is not None else None)
        return Result(self.request_id, answer.text, list(answer.output), answer.finish_reason or "error", usage, timings,
                      seed=self.seed, error=answer.error, error_code=answer.error_code, stop=answer.stop_hit,
                      logprobs=answer.logprobs, index=self.index, stored_prefix=kv.stored_prefix,
                      grammar_backend=self.grammar_backend, forced_tokens=answer.forced_tokens,
                      tool_syntax=getattr(self.params.grammar, "syntax", None),
                      reasoning=(answer.reasoning or "") if self.thinking is not None else None)

    def request_result(self) -> Result:
        """The Result of the request this sequence belongs to: its own, or for an n-request
        sample 0's text with `samples` holding one Result per sample (index order), usage
        counting the prompt once and every sample's tokens (as OpenAI does), and the request's
        outcome: the first failure, if any sample failed."""
        if self.group is None:
            return self.result()
        parts = [s.result() for s in self.group]
        first = parts[0]
        bad = next((r for r in parts if r.finish_reason not in ("stop", "length")), None)
        end = max((s.clock.finished_at or 0.0) for s in self.group)
        started = self.group[0].clock.first_token_at
        decode_ms = (end - started) * 1000 if started else 0.0
        after_first = sum(max(len(s.answer.output) - 1, 0) for s in self.group)
        timings = Timings(**{**first.timings.__dict__, "decode_ms": decode_ms,
                             "generated_tokens_per_s": after_first / (decode_ms / 1000) if decode_ms > 0 else 0.0})
        usage = Usage(prompt_tokens=first.usage.prompt_tokens, cached_tokens=first.usage.cached_tokens,
                      restored_tokens=first.usage.restored_tokens, completion_tokens=sum(r.usage.completion_tokens for r in parts),
                      accepted_prediction_tokens=sum(r.usage.accepted_prediction_tokens for r in parts),
                      rejected_prediction_tokens=sum(r.usage.rejected_prediction_tokens for r in parts),
                      reasoning_tokens=None if first.reasoning is None else sum(r.usage.reasoning_tokens or 0 for r in parts))
        return Result(first.request_id, first.text, first.token_ids, (bad or first).finish_reason, usage, timings,
                      seed=first.seed, error=bad.error if bad else None, error_code=bad.error_code if bad else None,
                      stop=first.stop, logprobs=first.logprobs, samples=parts, grammar_backend=first.grammar_backend,
                      forced_tokens=sum(r.forced_tokens for r in parts), tool_syntax=first.tool_syntax,
                      reasoning=first.reasoning)
