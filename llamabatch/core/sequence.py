"""One request's state inside the engine: status, tokens and their accounting, timestamps."""
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


@dataclass(eq=False)
class Sequence:
    """A request from admission to its terminal outcome.

    One accounting rule covers prefill, chunked prefill, prefix-cache hits and decode:
    `num_computed` tokens of `tokens` are in the slot's KV cache; the gap up to
    `num_tokens` is what still has to be evaluated (vLLM v1's idea).
    """

    request_id: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    sampler: Any = None  # the runner's sampler chain, built at submit time
    status: Status = Status.WAITING
    slot: int | None = None
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0  # prompt tokens reused from the prefix cache
    finish_reason: str | None = None
    error: str | None = None
    error_code: str | None = None
    submitted_at: float = field(default_factory=time.perf_counter)
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    deadline: float | None = None
    logprobs: list[dict[str, Any]] | None = None
    admit_order: int = 0  # FIFO rank among running prefills
    text: str = ""  # final text, set when finished
    stop_hit: str | None = None  # the stop string that ended it
    index: int = 0  # which sample of an n-request (0 for the sample whose slot evaluates the prompt)
    group: list["Sequence"] | None = None  # all samples of an n-request (shared list), None when n == 1
    completed: bool = False  # the engine has freed its sampler and counted it toward the Result
    sampling_apart: bool = False  # its next token is being sampled on a sampling thread (sampling_threads.py)
    # The disk prefix store (disk_prefix.py): save the slot's KV when exactly this many prompt
    # tokens are in it (the prefill chunk that crosses it is cut there); of num_cached, how many
    # were restored from the store; the entry a save of this request's prompt was queued as.
    save_at: int | None = None
    num_restored: int = 0
    stored_prefix: str | None = None
    # Structured output (llama/sampling/mask_grammar.py): how its grammar constrains it ("llguidance"
    # masks or llama.cpp's "llama" sampler; None unconstrained), and tokens it forced unsampled.
    grammar_backend: str | None = None
    forced_tokens: int = 0
    # Speculative decoding (core/drafts.py): where its guesses come from (None: it drafts none),
    # the prediction's tokens, and how many guesses joined its output or were turned down.
    drafter: Any = None
    prediction: list[int] | None = None
    accepted_drafts: int = 0
    rejected_drafts: int = 0
    # Priority (core/scheduling/admission.py): a request preempted for a higher-priority one waits with its
    # KV kept in host memory (`parked`, a kv_ledger.Parked) and resumes where it stopped; how often,
    # and for how long in all. `protected`: admitted by the fair share, it is never preempted.
    parked: Any = None
    preemptions: int = 0
    paused_ms: float = 0.0
    paused_at: float | None = None
    protected: bool = False
    queued: bool = False  # in the scheduler's queue (admitted ones stay WAITING until started)
    # Thinking models (core/thinking.py): how its answer may reason (None: the prompt marks no
    # reasoning); the reasoning text and the tokens generated inside the block, set when it ends.
    thinking: Any = None
    reasoning: str | None = None
    reasoning_tokens: int = 0
    reasoning_split: Any = None  # while it answers: its thinking.ReasoningSplit (core/scheduling/output_step.py)

    def __post_init__(self) -> None:
        if self.params.timeout:
            self.deadline = self.submitted_at + self.params.timeout
        if self.params.logprobs is not None:
            self.logprobs = []

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def num_pending(self) -> int:
        return self.num_tokens - self.num_computed

    def pending_tokens(self, limit: int) -> list[int]:
        """The next `limit` tokens that are not yet in the KV cache."""
        start = self.num_computed
        if start >= len(self.prompt):
            return self.output[start - len(self.prompt):start - len(self.prompt) + limit]
        end = min(self.num_tokens, start + limit)
        if end <= len(self.prompt):
            return self.prompt[start:end]
        return self.prompt[start:] + self.output[: end - len(self.prompt)]

    @property
    def finished(self) -> bool:
        return self.status == Status.FINISHED

    @property
    def members(self) -> list["Sequence"]:
        """Every sample of this request (itself alone when n == 1)."""
        return self.group if self.group is not None else [self]

    def result(self) -> Result:
        """The terminal Result: text, tokens, usage and timings from this sequence's clock."""
        admitted = self.admitted_at or self.finished_at
        first = self.first_token_at
        end = self.finished_at or time.perf_counter()
        prompt_ms = ((first or end) - admitted) * 1000 if admitted else 0.0
        decode_ms = (end - first) * 1000 if first else 0.0
        evaluated = len(self.prompt) - self.num_cached
        timings = Timings(
            queue_ms=((self.admitted_at or end) - self.submitted_at) * 1000,
            ttft_ms=(first - self.submitted_at) * 1000 if first else 0.0,
            prompt_ms=prompt_ms, decode_ms=decode_ms,
            prompt_tokens_per_s=evaluated / (prompt_ms / 1000) if first and prompt_ms > 0 else 0.0,
            generated_tokens_per_s=((len(self.output) - 1) / (decode_ms / 1000)
                                    if decode_ms > 0 and len(self.output) > 1 else 0.0),
            paused_ms=self.paused_ms, preemptions=self.preemptions)
        usage = Usage(prompt_tokens=len(self.prompt), cached_tokens=self.num_cached,
                      restored_tokens=self.num_restored, completion_tokens=len(self.output),
                      accepted_prediction_tokens=self.accepted_drafts,
                      rejected_prediction_tokens=self.rejected_drafts,
                      reasoning_tokens=self.reasoning_tokens if self.thinking is not None else None)
        return Result(self.request_id, self.text, list(self.output), self.finish_reason or "error", usage, timings,
                      seed=self.seed, error=self.error, error_code=self.error_code, stop=self.stop_hit,
                      logprobs=self.logprobs, index=self.index, stored_prefix=self.stored_prefix,
                      grammar_backend=self.grammar_backend, forced_tokens=self.forced_tokens,
                      tool_syntax=getattr(self.params.grammar, "syntax", None),
                      reasoning=(self.reasoning or "") if self.thinking is not None else None)

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
        end = max((s.finished_at or 0.0) for s in self.group)
        started = self.group[0].first_token_at
        decode_ms = (end - started) * 1000 if started else 0.0
        after_first = sum(max(len(s.output) - 1, 0) for s in self.group)
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
