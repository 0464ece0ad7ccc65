"""What a request gives back: streamed Deltas and one final Result."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FINISH_REASONS = ("stop", "length", "cancelled", "error", "timeout")


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache, not evaluated
    completion_tokens: int = 0
    restored_tokens: int = 0  # of cached_tokens, those restored from the disk prefix store
    # Speculative decoding (OpenAI's names, docs/speculative.md): guesses (from the prediction
    # or prompt lookup) verified and kept in the answer, and verified and turned down.
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    # of completion_tokens, those generated inside a thinking block; None: the prompt marks no reasoning
    reasoning_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def completion_details(self) -> dict[str, int]:
        """OpenAI's usage.completion_tokens_details."""
        details = {} if self.reasoning_tokens is None else {"reasoning_tokens": self.reasoning_tokens}
        return {**details, "accepted_prediction_tokens": self.accepted_prediction_tokens,
                "rejected_prediction_tokens": self.rejected_prediction_tokens}

    @property
    def guessed(self) -> bool:
        """Whether speculative decoding verified guesses for the request."""
        return bool(self.accepted_prediction_tokens or self.rejected_prediction_tokens)

    def to_dict(self, details: bool = True) -> dict[str, Any]:
        """The record's usage; `details`: with OpenAI's completion_tokens_details where guesses
        were verified (as restored_tokens, only where there is something to say)."""
        out: dict[str, Any] = {**asdict(self), "total_tokens": self.total_tokens}
        del out["accepted_prediction_tokens"], out["rejected_prediction_tokens"], out["reasoning_tokens"]
        if not self.restored_tokens:  # only where the disk prefix store served some: records stay as they were
            del out["restored_tokens"]
        if details and (self.guessed or self.reasoning_tokens is not None):
            out["completion_tokens_details"] = self.completion_details()
        return out


@dataclass
class Timings:
    queue_ms: float = 0.0  # submitted -> given a slot
    ttft_ms: float = 0.0  # submitted -> first token sampled
    prompt_ms: float = 0.0  # given a slot -> first token sampled (prefill)
    decode_ms: float = 0.0  # first token -> last token
    prompt_tokens_per_s: float = 0.0  # evaluated (not cached) prompt tokens / prompt_ms
    generated_tokens_per_s: float = 0.0  # tokens after the first / decode_ms
    # preempted for higher-priority requests: how often, and the time it waited with its KV
    # put aside (part of prompt_ms or decode_ms)
    paused_ms: float = 0.0
    preemptions: int = 0

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in asdict(self).items()}


@dataclass
class Delta:
    """A piece of streamed text. Deltas of one request join to exactly its Result.text."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    index: int = 0  # which sample of an n-request the text belongs to
    # A thinking answer's reasoning (core/thinking.py): joins to Result.reasoning as text joins to Result.text.
    reasoning: str = ""


@dataclass
class Result:
    request_id: int
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    timings: Timings
    seed: int | None = None
    error: str | None = None  # one-line message when finish_reason == "error"
    error_code: str | None = None
    stop: str | None = None  # the stop string that ended generation, if any
    logprobs: list[dict[str, Any]] | None = None
    index: int = 0  # which sample of an n-request this is
    samples: list["Result"] | None = None  # n > 1: one Result per sample, in index order
    deterministic: bool = False  # produced in deterministic mode (batch-invariant)
    # SamplingParams.store_prefix: the disk prefix store entry this request's prompt KV was
    # queued as (its name under the store folder); None when nothing was saved.
    stored_prefix: str | None = None
    # Structured output (docs/structured-output.md): "llguidance" (token masks) or "llama"
    # (llama.cpp's GBNF sampler) for a request with a grammar or json_schema, else None; and how
    # many of its completion tokens the grammar forced, unsampled.
    grammar_backend: str | None = None
    forced_tokens: int = 0
    # A thinking answer (docs/tools.md, "Thinking models"): the text of its reasoning block, apart
    # from `text` (the answer after it); None where the request's prompt marks no reasoning.
    reasoning: str | None = None
    # A tool call grammar's syntax (constraints/tool_syntax.py): how the answer's calls are read out.
    tool_syntax: str | None = None

    @property
    def all_logprobs(self) -> Any:
        """What records carry under "logprobs": the token records, or for n > 1 one list per sample."""
        if self.samples is not None:
            return None if self.logprobs is None else [s.logprobs for s in self.samples]
        return self.logprobs

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        if self.samples is not None:  # n > 1: every sample's text and finish reason, in index order
            head: dict[str, Any] = {"texts": [s.text for s in self.samples],
                                    "finish_reasons": [s.finish_reason for s in self.samples]}
        else:
            head = {"text": self.text}
        out: dict[str, Any] = {
            **head,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict(),
            "timings": self.timings.to_dict(),
            "seed": self.seed,
            "error": None if self.error is None else {"code": self.error_code, "message": self.error},
        }
        if self.reasoning is not None:  # a thinking answer: its reasoning block, apart from the text
            out["reasoning"] = [s.reasoning for s in self.samples] if self.samples is not None else self.reasoning
        if self.deterministic:
            out["deterministic"] = True
        if self.stored_prefix is not None:
            out["stored_prefix"] = self.stored_prefix
        return out


@dataclass
class Embedding:
    """One input's vector: `index` is its place in the request's inputs."""

    index: int
    vector: list[float]
    n_tokens: int  # tokens evaluated for it (after truncation)


@dataclass
class EmbeddingResult:
    """The one terminal outcome of an embeddings request: every input's vector, in input
    order (finish_reason "stop"), or none of them (error, cancelled, timeout)."""

    request_id: int
    embeddings: list[Embedding]
    finish_reason: str
    usage: Usage
    timings: Timings
    pooling: str = ""  # how the token vectors were pooled (mean, cls, last)
    error: str | None = None
    error_code: str | None = None
    deterministic: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_reason == "stop"

    @property
    def vectors(self) -> list[list[float]]:
        return [e.vector for e in self.embeddings]

    @classmethod
    def ended(cls, result: "Result | EmbeddingResult") -> "EmbeddingResult":
        """An ending without vectors (a generation-shaped Result from code that ends any
        request the same way: cancelled before it ran, refused, lost in a crash) as this type."""
        if isinstance(result, EmbeddingResult):
            return result
        return cls(result.request_id, [], result.finish_reason, result.usage, result.timings,
                   error=result.error, error_code=result.error_code, deterministic=result.deterministic)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "embeddings": self.vectors,
            "finish_reason": self.finish_reason,
            "pooling": self.pooling,
            "usage": self.usage.to_dict(details=False),
            "timings": self.timings.to_dict(),
            "error": None if self.error is None else {"code": self.error_code, "message": self.error},
        }
        if self.deterministic:
            out["deterministic"] = True
        return out
